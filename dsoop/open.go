package dsoop

/*
#include "dsoop.h"
#include "vm.h"
*/
import "C"

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Open loads the TVM module at path, or shares the one already loaded from it.
func Open(path string) (*Module, error) { return OpenPinned(path, "") }

// OpenPinned is Open for a library that must have the SHA-256 sha256 (hex; ""
// for any). The file is read once into a sealed memory file, and its digest and
// ELF structure are checked there before anything of it runs; the loader then
// maps that same copy, so nothing done to the file on disk afterwards changes
// what runs. A mismatch is ErrDigestMismatch, naming both digests.
//
// A path already loaded is shared while its file is unchanged (same size,
// modification time and inode); a changed file (a library rebuilt in place) is
// loaded anew, and the old copy stays with whoever holds it.
func OpenPinned(path, sha256 string) (*Module, error) {
	if strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("dsoop: library path %q holds a NUL byte", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %q: %w", path, err)
	}
	// Checked at every Open, not only the first: the allow-list may have changed.
	if err := checkAllowed(abs, getenv(AllowedDirsEnv)); err != nil {
		return nil, err
	}
	st, err := statLibrary(abs)
	if err != nil {
		return nil, err
	}
	// The memfds of libraries unloaded since the last sweep go now: those whose
	// last reference C released (a C holder's, through internal/native), or TVM
	// itself, after dsoop's releases.
	sweepLoaderFiles()
	defer lockPath(abs)()
	if m, err := openLoaded(abs, st, sha256); m != nil || err != nil {
		return m, err
	}
	sealed, err := sealLibrary(abs)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	// The memfd stays open while the library is loaded: backtraces read the
	// library through its path, and the loader knows it by that path.
	if err := checkDigest(abs, sealed.digest, sha256); err != nil {
		sealed.close()
		return nil, err
	}
	if sealed, err = sealed.atHighestLevel(filepath.Base(abs)); err != nil {
		sealed.close()
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	if err := Init(); err != nil {
		sealed.close()
		return nil, err
	}
	// A library without a pinned digest is tried in a separate process first; a
	// pinned one is the library the model was built with.
	if sha256 == "" {
		initMu.Lock()
		libs := found
		initMu.Unlock()
		if err := probe(sealed, libs); err != nil {
			sealed.close()
			return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
		}
	}
	if sealed.legacy != nil {
		lib, graph, err := openLegacyModel(sealed, abs)
		if err != nil {
			sealed.close()
			return nil, fmt.Errorf("dsoop: cannot load library %s: %w", abs, err)
		}
		return addEntry(&moduleEntry{path: abs, stat: st, sealed: sealed, legacy: lib, graph: graph, opens: 1}), nil
	}
	handle, err := loadModule(sealed)
	if err != nil {
		sealed.close()
		return nil, fmt.Errorf("dsoop: cannot load library %s: %w", abs, err)
	}
	var cerr C.DsoopError
	isVM := C.dsoop_module_is_vm(handle, &cerr)
	if isVM < 0 {
		C.dsoop_object_release(handle)
		sealed.close()
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, takeError(&cerr))
	}
	return addEntry(&moduleEntry{path: abs, stat: st, sealed: sealed, handle: handle, isVM: isVM == 1, opens: 1}), nil
}

var (
	modulesMu sync.Mutex
	modules   = map[string]*moduleEntry{} // the latest entry loaded from each path
	// loading serialises the Opens of each path, and only of that path: a large
	// library being read, hashed, probed and loaded stalls no Open of another.
	loading = map[string]*pathLock{} // guarded by modulesMu
)

// pathLock is held by the Open of a path in progress; others of the path wait.
type pathLock struct {
	mu      sync.Mutex
	waiters int // the Opens holding or waiting for mu; guarded by modulesMu
}

// lockPath waits for the Opens of path in progress, and returns the unlock.
func lockPath(path string) (unlock func()) {
	modulesMu.Lock()
	l := loading[path]
	if l == nil {
		l = &pathLock{}
		loading[path] = l
	}
	l.waiters++
	modulesMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		modulesMu.Lock()
		defer modulesMu.Unlock()
		if l.waiters--; l.waiters == 0 {
			delete(loading, path)
		}
	}
}

// addEntry records a library just loaded as its path's, and opens it.
func addEntry(e *moduleEntry) *Module {
	modulesMu.Lock()
	modules[e.path] = e
	modulesMu.Unlock()
	return newModule(e)
}

// openLoaded opens the library already loaded from path when its file is still
// the one st describes; nil and no error when there is none.
func openLoaded(path string, st os.FileInfo, sha256 string) (*Module, error) {
	modulesMu.Lock()
	defer modulesMu.Unlock()
	e, ok := modules[path]
	if !ok || !sameFile(e.stat, st) {
		return nil, nil
	}
	if err := checkDigest(path, e.sealed.digest, sha256); err != nil {
		return nil, err
	}
	e.opens++
	return newModule(e), nil
}

// sameFile reports whether two stats of a path are of the same, unchanged file.
func sameFile(a, b os.FileInfo) bool {
	if a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
		return false
	}
	as, aok := a.Sys().(*syscall.Stat_t)
	bs, bok := b.Sys().(*syscall.Stat_t)
	return !aok || !bok || (as.Dev == bs.Dev && as.Ino == bs.Ino)
}

// checkDigest refuses a library whose digest is not want (when want is set).
func checkDigest(path, digest, want string) error {
	if want == "" || strings.EqualFold(digest, want) {
		return nil
	}
	return fmt.Errorf("%w: the library at %s has SHA-256 %s, the model expects %s", ErrDigestMismatch, path, digest, want)
}

// FileSHA256 is the hex SHA-256 of a file's contents, read in a stream.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// statLibrary is the file at abs, checked so that the common mistakes get
// clear errors, not the loader's: missing (fs.ErrNotExist), or not a regular
// file.
func statLibrary(abs string) (fs.FileInfo, error) {
	st, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	if !st.Mode().IsRegular() {
		// A directory, a device or a FIFO: reading one to hash it could block forever.
		return nil, fmt.Errorf("dsoop: library %s is not a regular file (%s)", abs, st.Mode().Type())
	}
	return st, nil
}
