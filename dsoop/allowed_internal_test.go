package dsoop

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckAllowed(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib.so")
	require.NoError(t, os.WriteFile(lib, []byte("x"), 0o644))
	other := t.TempDir()
	tests := []struct {
		name    string
		allowed string
		wantErr string // "" when allowed
	}{
		{"no list allows all", "", ""},
		{"its folder", dir, ""},
		{"one of several", other + ":" + dir, ""},
		{"another folder", other, "is not in"},
		{"a relative entry is refused, not ignored", "relative/dir:" + dir, "not an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkAllowed(lib, tc.allowed)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNotAllowed)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
