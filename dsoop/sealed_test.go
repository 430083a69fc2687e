package dsoop_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// copyLibrary copies a test library to a path of its own, which no other test
// has loaded.
func copyLibrary(t *testing.T, from string) string {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	to := filepath.Join(t.TempDir(), "lib.so")
	require.NoError(t, os.WriteFile(to, data, 0o644))
	return to
}

// openAddOne opens the library at path and its add_one, closed when the test ends.
func openAddOne(t *testing.T, path string) (*dsoop.Module, *dsoop.Func) {
	t.Helper()
	m, err := dsoop.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	f, err := m.Func("add_one")
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return m, f
}

func addOneWorks(t *testing.T, f *dsoop.Func) {
	t.Helper()
	out := make([]float32, 2)
	require.NoError(t, f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, out)))
	assert.Equal(t, []float32{2, 3}, out)
}

// What runs is the copy that was verified: changing the file on disk after the
// load changes nothing, and breaks nothing.
func TestLoadedLibraryIgnoresTheFileAfterwards(t *testing.T) {
	other, err := os.ReadFile(ffiLib)
	require.NoError(t, err)
	tests := []struct {
		name   string
		change func(path string) error
	}{
		{"overwritten in place", func(p string) error { return os.WriteFile(p, other, 0o644) }},
		{"truncated to nothing", func(p string) error { return os.Truncate(p, 0) }},
		{"truncated to 4 KiB", func(p string) error { return os.Truncate(p, 4096) }},
		{"deleted", os.Remove},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := copyLibrary(t, testLib)
			_, f := openAddOne(t, path)
			addOneWorks(t, f)
			require.NoError(t, tc.change(path))
			addOneWorks(t, f)
			// An error raised now builds a backtrace, which reads the library.
			require.Error(t, f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, make([]float32, 3))))
		})
	}
}

// A digest that does not match refuses the library before any of its code runs.
func TestDigestIsCheckedBeforeTheLibraryRuns(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "loaded")
	t.Setenv("TVMDSOOP_TEST_LOAD_MARKER", marker)
	path := copyLibrary(t, ffiLib)

	_, err := dsoop.OpenPinned(path, "00")
	require.ErrorIs(t, err, dsoop.ErrDigestMismatch)
	assert.NoFileExists(t, marker, "the refused library's constructor ran")

	digest, err := dsoop.FileSHA256(path)
	require.NoError(t, err)
	m, err := dsoop.OpenPinned(path, digest)
	require.NoError(t, err)
	defer m.Close()
	assert.FileExists(t, marker, "the verified library was loaded")
}

// Files that are not libraries for this process are refused by the checks, not
// handed to the loader.
func TestNotALibraryIsRefusedBeforeLoading(t *testing.T) {
	lib, err := os.ReadFile(testLib)
	require.NoError(t, err)
	wrongMachine := append([]byte(nil), lib...)
	wrongMachine[18] = 0xb7 // e_machine: EM_AARCH64 on x86-64 (x86-64 on arm64)
	if wrongMachine[18] == lib[18] {
		wrongMachine[18] = 0x3e
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"text", []byte("not a library")},
		{"empty", nil},
		{"the first 64 bytes of a library", lib[:64]},
		{"another machine", wrongMachine},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "lib.so")
			require.NoError(t, os.WriteFile(path, tc.data, 0o644))
			_, err := dsoop.Open(path)
			require.ErrorIs(t, err, dsoop.ErrNotALibrary)
		})
	}
}

// TestLoaderSlotsOutsideWritableMemoryAreRefused: a symbol a loader writes a
// pointer into (TVM's loader: the __TVM... context pointers TVM's runtime
// registers and the module context; dsoop's own for older libraries) that is not
// writable memory of the library is refused before loading: the write, or the
// read that checks the pointer after the load, would fault. Each of these
// crashed the process before.
func TestLoaderSlotsOutsideWritableMemoryAreRefused(t *testing.T) {
	const ffiFunction = `#include <tvm/ffi/c_api.h>
TVM_FFI_DLL_EXPORT int __tvm_ffi_add_one(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) { return 0; }
`
	tests := []struct {
		name, source, symbol string
	}{
		{"a context pointer among constants", ffiFunction + "void* const __TVMBackendParallelLaunch = 0;\n",
			"__TVMBackendParallelLaunch"},
		{"a context pointer at an absolute address", ffiFunction +
			`__asm__(".globl __TVMBackendParallelLaunch\n.set __TVMBackendParallelLaunch, 0x10\n");`,
			"__TVMBackendParallelLaunch"},
		{"a context pointer that is a function", ffiFunction + "void __TVMBackendAllocWorkspace(void) {}\n",
			"__TVMBackendAllocWorkspace"},
		{"a context pointer made read-only after relocation", ffiFunction +
			"static int target;\nvoid* const __TVMBackendFreeWorkspace = &target;\n", "__TVMBackendFreeWorkspace"},
		{"the module context among constants", ffiFunction + "void* const __tvm_ffi__library_ctx = 0;\n",
			"__tvm_ffi__library_ctx"},
		{"an older library's context pointer among constants",
			"void* const __TVMAPISetLastError = 0;\nint add_one(void* a, int* c, int n, void* r, int* rc, void* h) { return 0; }\n",
			"__TVMAPISetLastError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dsoop.Open(ccLibrary(t, tc.source))
			require.ErrorIs(t, err, dsoop.ErrNotALibrary)
			assert.Contains(t, err.Error(), "its symbol "+tc.symbol+", which the loader writes a pointer into")
		})
	}
}

// A library rebuilt at the same path (the notebook loop) loads anew; what was
// taken from the old one keeps working.
func TestRebuiltLibraryLoadsAnew(t *testing.T) {
	path := copyLibrary(t, testLib)
	m, f := openAddOne(t, path)

	other, err := os.ReadFile(ffiLib)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, other, 0o644))
	rebuilt, err := dsoop.Open(path)
	require.NoError(t, err)
	defer rebuilt.Close()
	assert.NotEqual(t, m.SHA256(), rebuilt.SHA256())
	g, err := rebuilt.Func("identity")
	require.NoError(t, err, "the new file's functions")
	g.Close()
	addOneWorks(t, f)
}
