package dsoop_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// TestPlainGoBuild: a module of a user's own that requires this one builds with
// `go build` alone (no cgo flags: the TVM-FFI headers are vendored, and
// libtvm_ffi.so is opened at run time), and runs with only
// TVMDSOOP_LIBRARY_PATH set. Offline: the requirement is replaced by this
// checkout, and the rest comes from the module cache (GOPROXY=off).
//
// With an empty build cache the build takes about 22 s on a 2-core machine
// (the standard library, cgo, dsoop's C); with the cache `go test` shares, 2-5 s.
func TestPlainGoBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go program: about 22 s with a cold build cache")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	searchPath := os.Getenv(dsoop.LibraryPathEnv)
	if searchPath == "" {
		t.Skip(dsoop.LibraryPathEnv + " is not set (make test sets it): the program would have no TVM runtime")
	}
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	goMod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	require.NoError(t, err)
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(goMod)
	require.NotNil(t, goVersion, "no go directive in go.mod")
	goSum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	require.NoError(t, err)
	// The user's program is the Go example: add_one on a Go slice.
	program, err := os.ReadFile(filepath.Join(repo, "examples", "go", "addone", "main.go"))
	require.NoError(t, err)

	dir := t.TempDir()
	userMod := "module example.com/user\n\ngo " + string(goVersion[1]) + "\n\n" +
		"require github.com/tvmdsoop/tvmdsoop v0.0.0\n\n" +
		"replace github.com/tvmdsoop/tvmdsoop => " + repo + "\n"
	for name, content := range map[string][]byte{"go.mod": []byte(userMod), "go.sum": goSum, "main.go": program} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), content, 0o644))
	}

	// The caches of this go, named outright: GOENV=off leaves out any go env -w
	// settings (cgo flags among them), so the build sees no flags of ours.
	caches, err := exec.Command(goTool, "env", "GOMODCACHE", "GOCACHE").Output()
	require.NoError(t, err)
	modCache, buildCache, _ := strings.Cut(strings.TrimSpace(string(caches)), "\n")
	env := []string{"GOENV=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOMODCACHE=" + modCache, "GOCACHE=" + buildCache}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "CGO_") && !strings.HasPrefix(name, "GO") && !strings.HasPrefix(name, "TVMDSOOP_") {
			env = append(env, kv)
		}
	}
	build := exec.Command(goTool, "build", "-o", "addone", ".")
	build.Dir, build.Env = dir, env
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build of a user's module: %s", out)

	run := exec.Command(filepath.Join(dir, "addone"), testLib)
	run.Env = []string{dsoop.LibraryPathEnv + "=" + searchPath}
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "input:  [1 2 3 4]\noutput: [2 3 4 5]\n", string(out))
}
