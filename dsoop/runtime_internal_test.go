package dsoop

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindLibraries(t *testing.T) {
	root := t.TempDir()
	folder := func(name string, files ...string) string {
		dir := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, f := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o644))
		}
		return dir
	}
	ffi := folder("ffi", ffiLibraryName)
	tvm := folder("tvm", runtimeLibraryName, cudaRuntimeLibraryName)
	tvmNoCUDA := folder("tvm-no-cuda", runtimeLibraryName)
	strayCUDA := folder("stray", cudaRuntimeLibraryName)
	cudart := folder("cudart", cudartLibraryName)
	empty := folder("empty")
	join := func(dirs ...string) string { return strings.Join(dirs, string(os.PathListSeparator)) }

	tests := []struct {
		name       string
		searchPath string
		want       libraries
		wantErr    bool
	}{
		{"no search path: the loader decides", "", libraries{ffi: ffiLibraryName}, false},
		{"ffi only", ffi, libraries{ffi: filepath.Join(ffi, ffiLibraryName)}, false},
		{"everything", join(ffi, tvm, cudart), libraries{
			ffi:         filepath.Join(ffi, ffiLibraryName),
			runtime:     filepath.Join(tvm, runtimeLibraryName),
			cudaRuntime: filepath.Join(tvm, cudaRuntimeLibraryName),
			cudart:      filepath.Join(cudart, cudartLibraryName),
		}, false},
		{"the CUDA runtime only beside the TVM runtime", join(ffi, strayCUDA, tvmNoCUDA), libraries{
			ffi:     filepath.Join(ffi, ffiLibraryName),
			runtime: filepath.Join(tvmNoCUDA, runtimeLibraryName),
		}, false},
		{"the first folder wins", join(ffi, tvmNoCUDA, tvm), libraries{
			ffi:     filepath.Join(ffi, ffiLibraryName),
			runtime: filepath.Join(tvmNoCUDA, runtimeLibraryName),
		}, false},
		{"empty entries are skipped", ":" + ffi + ":", libraries{ffi: filepath.Join(ffi, ffiLibraryName)}, false},
		{"no libtvm_ffi.so", join(empty, tvm), libraries{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := findLibraries(tt.searchPath)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrRuntimeNotFound)
				assert.Contains(t, err.Error(), tt.searchPath)
				assert.Contains(t, err.Error(), runtimeHelp)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestCheckRuntimeVersion(t *testing.T) {
	built := version{0, 1, 16}
	tests := []struct {
		name  string
		found version
		ok    bool
	}{
		{"the same", version{0, 1, 16}, true},
		{"an older patch", version{0, 1, 15}, true},
		{"a newer patch", version{0, 1, 99}, true},
		{"an older minor", version{0, 0, 16}, false},
		{"a newer minor", version{0, 2, 0}, false},
		{"another major", version{1, 1, 16}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRuntimeVersion("/x/libtvm_ffi.so", tc.found, built)
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrRuntimeVersion)
			for _, s := range []string{"/x/libtvm_ffi.so", tc.found.String(), "0.1.16", "apache-tvm-ffi 0.1.x", LibraryPathEnv} {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}
