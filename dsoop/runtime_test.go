package dsoop_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// initChildEnv makes this test binary a child that only runs dsoop.Init and
// reports: Init runs once per process, so its failures are seen in fresh ones.
const initChildEnv = "DSOOP_TEST_INIT_CHILD"

// initReport is what an Init child prints.
type initReport struct {
	Error           string
	RuntimeNotFound bool // errors.Is(err, dsoop.ErrRuntimeNotFound)
	RuntimeVersion  bool // errors.Is(err, dsoop.ErrRuntimeVersion)
}

// runInitChild is TestMain in an Init child: it never returns.
func runInitChild() {
	var report initReport
	if err := dsoop.Init(); err != nil {
		report = initReport{err.Error(), errors.Is(err, dsoop.ErrRuntimeNotFound), errors.Is(err, dsoop.ErrRuntimeVersion)}
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// initInChild runs dsoop.Init in a fresh process with the library search
// variable set to searchPath (unset when nil), and nothing else that could
// help the loader (LD_LIBRARY_PATH).
func initInChild(t *testing.T, searchPath *string) initReport {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != dsoop.LibraryPathEnv && name != "LD_LIBRARY_PATH" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, initChildEnv+"=1")
	if searchPath != nil {
		cmd.Env = append(cmd.Env, dsoop.LibraryPathEnv+"="+*searchPath)
	}
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	var report initReport
	require.NoError(t, json.Unmarshal(out, &report), "%s", out)
	return report
}

// fakeRuntime builds, in a folder of its own, a libtvm_ffi.so whose
// TVMFFIGetVersion reports major.minor.0 and that has nothing else.
func fakeRuntime(t *testing.T, major, minor int) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build a stand-in TVM-FFI runtime")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	code := fmt.Sprintf(`typedef struct { unsigned major, minor, patch; } V;
void TVMFFIGetVersion(V* v) { v->major = %d; v->minor = %d; v->patch = 0; }
`, major, minor)
	require.NoError(t, os.WriteFile(src, []byte(code), 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-o", filepath.Join(dir, "libtvm_ffi.so"), src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return dir
}

// How to get the runtime, said wherever it is missing.
var runtimeHelp = []string{
	dsoop.LibraryPathEnv, "apache-tvm-ffi", "tvm_ffi/lib",
	`python -c "import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())"`,
	"libtvm_runtime.so", "apache-tvm", "tvm/lib",
}

func TestRuntimeNotFoundSaysHowToFixIt(t *testing.T) {
	emptyDir := t.TempDir()
	tests := []struct {
		name       string
		searchPath *string
		says       []string
	}{
		{"unset, and nothing for the loader to find", nil,
			[]string{"libtvm_ffi.so: cannot open shared object file", dsoop.LibraryPathEnv + " is not set"}},
		{"set to a folder without it", &emptyDir, []string{dsoop.LibraryPathEnv + "=" + emptyDir}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			report := initInChild(t, tc.searchPath)
			if tc.searchPath == nil && report.Error == "" {
				t.Skip("the dynamic loader finds a libtvm_ffi.so of its own here")
			}
			assert.True(t, report.RuntimeNotFound, report.Error)
			for _, s := range append(tc.says, runtimeHelp...) {
				assert.Contains(t, report.Error, s)
			}
		})
	}
}

func TestRuntimeOfAnotherVersionIsRefused(t *testing.T) {
	dir := fakeRuntime(t, 0, 99)
	report := initInChild(t, &dir)
	assert.True(t, report.RuntimeVersion, report.Error)
	assert.False(t, report.RuntimeNotFound, report.Error)
	assert.Contains(t, report.Error, filepath.Join(dir, "libtvm_ffi.so"))
	assert.Contains(t, report.Error, "TVM-FFI 0.99.0")
}

func TestInitAcceptsTheInstalledRuntime(t *testing.T) {
	require.NoError(t, dsoop.Init())
}

// libraryChildEnv makes this test binary a child that opens the library it names,
// calls its add_one on [1] and reports: in a fresh process, whose runtime
// libraries the test chooses.
const libraryChildEnv = "DSOOP_TEST_LIBRARY_CHILD"

// libraryReport is what a library child prints.
type libraryReport struct {
	Error        string
	NeedsRuntime bool // errors.Is(err, dsoop.ErrTVMRuntimeNotLoaded)
	Out          float32
}

// runLibraryChild is TestMain in a library child: it never returns.
func runLibraryChild(lib string) {
	var report libraryReport
	err := func() error {
		m, err := dsoop.Open(lib)
		if err != nil {
			return err
		}
		f, err := m.Func("add_one")
		if err != nil {
			return err
		}
		out := []float32{0}
		err = f.Call(vector([]float32{1}), vector(out))
		report.Out = out[0]
		return err
	}()
	if err != nil {
		report.Error, report.NeedsRuntime = err.Error(), errors.Is(err, dsoop.ErrTVMRuntimeNotLoaded)
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// ffiOnlyPath is the folder of libtvm_ffi.so on the search path: TVM-FFI without TVM's runtime.
func ffiOnlyPath(t *testing.T) string {
	t.Helper()
	for _, dir := range filepath.SplitList(os.Getenv(dsoop.LibraryPathEnv)) {
		if _, err := os.Stat(filepath.Join(dir, "libtvm_ffi.so")); err == nil {
			return dir
		}
	}
	t.Skipf("%s names no folder holding libtvm_ffi.so (run `make test`)", dsoop.LibraryPathEnv)
	return ""
}

// addOneSource is a TVM-FFI library's add_one on float32 vectors, in C, after
// the declarations in prefix.
func addOneSource(prefix string) string {
	return `#include <tvm/ffi/c_api.h>
` + prefix + `
TVM_FFI_DLL_EXPORT int __tvm_ffi_add_one(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  const DLTensor* x = (const DLTensor*)args[0].v_ptr;
  const DLTensor* y = (const DLTensor*)args[1].v_ptr;
  for (int64_t i = 0; i < x->shape[0]; ++i) ((float*)y->data)[i] = ((const float*)x->data)[i] + 1;
  return 0;
}
`
}

// TestLibrariesWithoutTVMsRuntime: with only libtvm_ffi.so on the search path
// (apache-tvm-ffi without apache-tvm), a library that calls into TVM's runtime
// through a pointer the runtime fills at load (workspace memory, parallel loops),
// or that embeds a Relax VM executable, is refused by name with the fix, before
// any function of it runs (a call through the unset pointer would jump to address
// zero); one that only needs TVM-FFI runs.
func TestLibrariesWithoutTVMsRuntime(t *testing.T) {
	ffiOnly := ffiOnlyPath(t)
	tests := []struct {
		name     string
		lib      func(t *testing.T) string
		contains []string // in the error; none: add_one runs
	}{
		{name: "TVM 0.20, errors only: TVM-FFI is enough",
			lib: func(*testing.T) string { return filepath.Join(legacyFixtures, "add_one.so") }},
		{name: "TVM 0.20, workspace and parallel loops",
			lib:      func(*testing.T) string { return filepath.Join(legacyFixtures, "legacy.so") },
			contains: []string{"libtvm_runtime.so", "TVMBackend"}},
		{name: "TVM-FFI, no context pointer",
			lib: func(t *testing.T) string { return ccLibrary(t, addOneSource("")) }},
		{name: "TVM-FFI, a parallel loop's pointer",
			lib:      func(t *testing.T) string { return ccLibrary(t, addOneSource("void* __TVMBackendParallelLaunch = 0;")) },
			contains: []string{"TVMBackendParallelLaunch", "libtvm_runtime.so", "apache-tvm", dsoop.LibraryPathEnv}},
		{name: "tvm.compile, parallel matmul",
			lib:      func(*testing.T) string { return filepath.Join(filepath.Dir(testLib), "matmul.so") },
			contains: []string{"__TVMBackend", "libtvm_runtime.so", dsoop.LibraryPathEnv}},
		{name: "tvm.compile, a Relax VM executable",
			lib:      func(*testing.T) string { return filepath.Join(modelsDir, "mlp.so") },
			contains: []string{"relax.VMExecutable", "libtvm_runtime.so", dsoop.LibraryPathEnv}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), libraryChildEnv+"="+tc.lib(t), dsoop.LibraryPathEnv+"="+ffiOnly)
			out, err := cmd.Output()
			require.NoError(t, err, "%s", out)
			var report libraryReport
			require.NoError(t, json.Unmarshal(out, &report), "%s", out)
			if len(tc.contains) == 0 {
				assert.Empty(t, report.Error)
				assert.Equal(t, float32(2), report.Out)
				return
			}
			assert.True(t, report.NeedsRuntime, report.Error)
			for _, s := range tc.contains {
				assert.Contains(t, report.Error, s)
			}
		})
	}
}

// TestContextPointerTheRuntimeDoesNotFill: with TVM's runtime loaded, a pointer
// it fills lets the library run, and one it has no function for is refused by
// name at Open, not called.
func TestContextPointerTheRuntimeDoesNotFill(t *testing.T) {
	m, err := dsoop.Open(ccLibrary(t, addOneSource("void* __TVMBackendParallelLaunch = 0;")))
	require.NoError(t, err)
	defer m.Close()
	f, err := m.Func("add_one")
	require.NoError(t, err)
	defer f.Close()
	out := []float32{0}
	require.NoError(t, f.Call(vector([]float32{1}), vector(out)))
	assert.Equal(t, float32(2), out[0])

	_, err = dsoop.Open(ccLibrary(t, addOneSource("void* __TVMBackendNoSuchHook = 0;")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "it calls TVMBackendNoSuchHook through __TVMBackendNoSuchHook")
	assert.Contains(t, err.Error(), "libtvm_runtime.so")
}
