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
