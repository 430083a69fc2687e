package dsoop_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// The modules the test libraries embed, as Open reads them before loading.
func TestEmbeddedModules(t *testing.T) {
	tests := []struct {
		lib  string
		want []string
	}{
		{testLib, nil},
		{cudaLib, []string{"cuda:cuda"}}, // CUDA source: TVM compiled it without a CUDA driver
		{modelsDir + "/mlp.so", []string{"relax.VMExecutable"}},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.lib), func(t *testing.T) {
			got, err := dsoop.EmbeddedModules(tc.lib)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
