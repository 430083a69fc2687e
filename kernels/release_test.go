package kernels

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// testLibrary builds tests/modules/build_modules.py's testfuncs.so and gives a
// copy of it under name, so that the memfds a test watches are its own.
func testLibrary(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds TVM's test library")
	}
	dir := t.TempDir()
	require.NoError(t, testenv.RunPython("..", "tests/modules/build_modules.py", dir))
	data, err := os.ReadFile(filepath.Join(dir, "testfuncs.so"))
	require.NoError(t, err)
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	require.NoError(t, dsoop.Init())
	return path
}

var cpu = dlpack.Device{Type: dlpack.CPU}

// What kernels resolve keeps the library loaded, one copy for all of them, and
// the library leaves with the last release; a failed resolve holds nothing.
func TestResolvedLibraryLeavesWithItsLastRelease(t *testing.T) {
	const name = "kernels_release.so"
	path := testLibrary(t, name)

	_, err := resolve(path, "no_such_function", "", nil, cpu, true)
	require.ErrorIs(t, err, dsoop.ErrFunctionNotFound)
	assert.Empty(t, testenv.Memfds(t, "tvmdsoop:"+name), "a failed resolve holds nothing")

	first, err := resolve(path, "add_one", "", nil, cpu, true)
	require.NoError(t, err)
	second, err := resolve(path, "add_one", "", nil, cpu, true)
	require.NoError(t, err)
	assert.Equal(t, first.fn, second.fn, "kernels of one function share its object (and Shared its Resolved)")
	assert.Len(t, testenv.Memfds(t, "tvmdsoop:"+name), 1, "one load for both")
	assert.Equal(t, int64(-1), first.arity)

	first.held.release()
	assert.Len(t, testenv.Memfds(t, "tvmdsoop:"+name), 1, "the second still holds it")
	second.held.release()
	assert.Empty(t, testenv.Memfds(t, "tvmdsoop:"+name), "unloaded, its memfd closed, with the last release")
}
