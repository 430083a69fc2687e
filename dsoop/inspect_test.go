package dsoop_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// What Inspect reads of each kind of library, without loading it.
func TestInspect(t *testing.T) {
	tests := []struct {
		name      string
		path      func() string
		kind      string
		functions []string // at least these
		params    map[string][]string
		embeds    string
	}{
		{"a tvm.compile'd functions library", func() string { return testLib }, dsoop.KindFunctions,
			[]string{"add_one"}, nil, ""},
		{"tvm-ffi's export macros", func() string { return ffiLib }, dsoop.KindFunctions,
			[]string{"add_int", "identity", "scale"}, nil, ""},
		{"a Relax model", func() string { return filepath.Join(modelsDir, "two_outputs.so") }, dsoop.KindModel,
			[]string{"main"}, map[string][]string{"main": {"x"}}, "relax.VMExecutable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path()
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			in, err := dsoop.Inspect(path)
			require.NoError(t, err)
			sum := sha256.Sum256(data)
			assert.Equal(t, hex.EncodeToString(sum[:]), in.SHA256)
			assert.Equal(t, int64(len(data)), in.Size)
			assert.Equal(t, tc.kind, in.Kind)
			assert.Equal(t, ">=0.22", in.TVM)
			assert.Subset(t, in.Functions, tc.functions)
			assert.IsNonDecreasing(t, in.Functions, "sorted")
			for fn, params := range tc.params {
				assert.Equal(t, params, in.Parameters[fn])
			}
			if tc.embeds != "" {
				require.NotEmpty(t, in.Embedded)
				assert.Equal(t, tc.embeds, in.Embedded[0].Kind)
			}
			assert.False(t, dsoop.Loaded(path), "inspected, not loaded")
		})
	}
}

func TestInspectRefuses(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text.so")
	require.NoError(t, os.WriteFile(text, []byte("hello, not an ELF file"), 0o644))
	tests := []struct {
		name string
		path string
		want error
	}{
		{"a missing file", filepath.Join(dir, "missing.so"), fs.ErrNotExist},
		{"a file that is not a library", text, dsoop.ErrNotALibrary},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dsoop.Inspect(tc.path)
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err := dsoop.Inspect(dir)
	require.Error(t, err, "a directory")
}
