package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Memfds lists the process's open memfds whose names begin with prefix (dsoop
// seals a library into one named "tvmdsoop:" and the library's file name): what
// the unloading tests watch go.
func Memfds(t testing.TB, prefix string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil &&
			strings.HasPrefix(target, "/memfd:"+prefix) {
			named = append(named, target)
		}
	}
	return named
}
