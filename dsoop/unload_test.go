package dsoop_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// loaderFile is the memfd a library was loaded from, as the tests watch it.
type loaderFile struct {
	path  string // /proc/self/fd/N, the name the loader knows the library by
	inode uint64
}

func loaderFileOf(m *dsoop.Module) loaderFile {
	path, inode := dsoop.LoaderFile(m)
	return loaderFile{path, inode}
}

// mapped reports whether the process maps the memfd (the loaded library's
// segments do).
func (f loaderFile) mapped(t *testing.T) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	inode := strconv.FormatUint(f.inode, 10)
	for line := range strings.Lines(string(maps)) {
		// address perms offset dev inode path
		if fields := strings.Fields(line); len(fields) >= 6 && fields[4] == inode && strings.HasPrefix(fields[5], "/memfd:") {
			return true
		}
	}
	return false
}

// open reports whether the memfd is still open at its fd number.
func (f loaderFile) open() bool {
	var st syscall.Stat_t
	return syscall.Stat(f.path, &st) == nil && st.Ino == f.inode
}

// A library leaves with the last of what uses it: its Modules, its Funcs, its
// model's VMFuncs. Its mapping and memfd go then, not before; until then what
// holds it works.
func TestReleasedLibraryLeaves(t *testing.T) {
	tests := []struct {
		name string
		lib  func() string
		// use takes what outlives the Module from it, and returns the check that
		// it still works and its release.
		use func(t *testing.T, m *dsoop.Module) (works func(), release func())
	}{
		{"nothing outlives the Module", func() string { return testLib }, nil},
		{"a Func outlives its Module", func() string { return testLib },
			func(t *testing.T, m *dsoop.Module) (func(), func()) {
				f, err := m.Func("add_one")
				require.NoError(t, err)
				return func() { addOneWorks(t, f) }, func() { f.Close() }
			}},
		{"a Func of a C++ library outlives its Module", func() string { return ffiLib },
			func(t *testing.T, m *dsoop.Module) (func(), func()) {
				f, err := m.Func("add_int")
				require.NoError(t, err)
				return func() {
					got, err := f.CallValue(int64(2), int64(3))
					require.NoError(t, err)
					assert.Equal(t, int64(5), got)
				}, func() { f.Close() }
			}},
		{"a model's VMFunc outlives its Module", func() string { return filepath.Join(modelsDir, "two_outputs.so") },
			func(t *testing.T, m *dsoop.Module) (func(), func()) {
				f, err := m.VMFunc("main", cpu)
				require.NoError(t, err)
				return func() {
					out, err := f.Call(mustTensor(t, []float32{1, 2, 3, 4}, 1, 4))
					require.NoError(t, err)
					defer out.Close()
					assert.Equal(t, []float32{2, 3, 4, 5}, floats(t, out.Tensors[0]))
				}, func() { f.Close() }
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := dsoop.Open(copyLibrary(t, tc.lib()))
			require.NoError(t, err)
			file := loaderFileOf(m)
			require.True(t, file.mapped(t), "loaded from its memfd")
			if tc.use != nil {
				works, release := tc.use(t, m)
				require.NoError(t, m.Close())
				assert.True(t, file.mapped(t), "still loaded for what holds it")
				assert.True(t, file.open(), "its memfd stays while it is loaded")
				works()
				release()
			} else {
				require.NoError(t, m.Close())
			}
			assert.False(t, file.mapped(t), "unmapped with the last release")
			assert.False(t, file.open(), "its memfd closed")
		})
	}
}

// A model's outputs are TVM's tensors, not the library's: they keep their
// values once the library has left.
func TestOutputsOutliveTheirLibrary(t *testing.T) {
	m, err := dsoop.Open(copyLibrary(t, filepath.Join(modelsDir, "two_outputs.so")))
	require.NoError(t, err)
	file := loaderFileOf(m)
	f, err := m.VMFunc("main", cpu)
	require.NoError(t, err)
	out, err := f.Call(mustTensor(t, []float32{1, 2, 3, 4}, 1, 4))
	require.NoError(t, err)
	defer out.Close()
	require.NoError(t, f.Close())
	require.NoError(t, m.Close())
	require.False(t, file.mapped(t))
	assert.Equal(t, []float32{2, 3, 4, 5}, floats(t, out.Tensors[0]))
	assert.Equal(t, []float32{2, 4, 6, 8}, floats(t, out.Tensors[1]))
}

// Libraries loaded after another was released run their own code, whether the
// other has left (its fd number, and so its loader path, is free for them) or
// a Func still holds it loaded (its path stays its own).
func TestLaterLibrariesRunTheirOwnCode(t *testing.T) {
	tests := []struct {
		name   string
		holdsA bool
	}{
		{"the first has left", false},
		{"a Func holds the first", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			first, err := dsoop.Open(copyLibrary(t, testLib))
			require.NoError(t, err)
			file := loaderFileOf(first)
			if tc.holdsA {
				f, err := first.Func("add_one")
				require.NoError(t, err)
				defer func() {
					addOneWorks(t, f)
					f.Close()
				}()
			}
			require.NoError(t, first.Close())
			assert.Equal(t, tc.holdsA, file.open(), "its memfd stays while it is loaded")
			for range 3 { // each in turn at the lowest free fd number: the first's, once free
				m, err := dsoop.Open(copyLibrary(t, ffiLib))
				require.NoError(t, err)
				if loaderFileOf(m).path == file.path {
					t.Logf("%s given again", file.path)
				}
				f, err := m.Func("add_int")
				require.NoError(t, err, "ffifuncs.so's own function, not testfuncs.so's")
				got, err := f.CallValue(int64(2), int64(3))
				require.NoError(t, err)
				assert.Equal(t, int64(5), got)
				_, err = m.Func("add_one")
				require.ErrorIs(t, err, dsoop.ErrFunctionNotFound, "testfuncs.so's function, not there")
				require.NoError(t, f.Close())
				require.NoError(t, m.Close())
			}
		})
	}
}
