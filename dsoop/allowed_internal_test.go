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

func TestIsReservedName(t *testing.T) {
	tests := []struct {
		name     string
		reserved bool
	}{
		{"_library_ctx", true},
		{"_library_bin", true},
		{"_metadata_add_one", true},
		{"_doc_add_one", true},
		{"_cubin_kernels", true},
		{"_cubin_kernels_end", true},
		{"library_ctx", true}, // TVM 0.21's names for the same symbols
		{"library_bin", true},
		{"__tvm_main__", true}, // TVM <= 0.20's
		{"__tvm_module_ctx", true},
		{"__tvm_dev_mblob", true},
		{"__tvm_ffi_add_one", true}, // a symbol, not a name
		{"main", false},             // the module's entry function
		{"add_one", false},
		{"_library", false},
		{"library_bin2", false},
		{"metadata_add_one", false},
		{"_private_helper", false},
		{"fused_matmul_add_relu", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.reserved, isReservedName(tc.name))
		})
	}
}
