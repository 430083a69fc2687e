package dsoop_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// ccLibrary builds a shared library from C source in a folder of its own, with
// the vendored DLPack and TVM-FFI headers on the include path, or skips the test
// without a C compiler.
func ccLibrary(tb testing.TB, source string) string {
	tb.Helper()
	compiler, err := exec.LookPath("cc")
	if err != nil {
		tb.Skip("no C compiler (cc) to build the test library")
	}
	repo, err := filepath.Abs("..")
	require.NoError(tb, err)
	dir := tb.TempDir()
	src, lib := filepath.Join(dir, "lib.c"), filepath.Join(dir, "lib.so")
	require.NoError(tb, os.WriteFile(src, []byte(source), 0o644))
	out, err := exec.Command(compiler, "-shared", "-fPIC", "-O1", "-I"+repo,
		"-I"+filepath.Join(repo, "third_party/tvm-ffi/include"), "-o", lib, src).CombinedOutput()
	require.NoError(tb, err, "%s", out)
	return lib
}
