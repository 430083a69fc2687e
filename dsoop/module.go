package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// ErrFunctionNotFound means a module has no function of the requested name.
var ErrFunctionNotFound = errors.New("function not found")

// Module is an open TVM module. A library is loaded once per process per path:
// every Open of the same file shares one loaded module, which is released when
// the last Module opened on it is closed. Funcs keep their library loaded on their
// own, so closing a Module does not invalidate the Funcs taken from it.
type Module struct {
	entry  *moduleEntry
	mu     sync.RWMutex
	closed bool
}

// moduleEntry is one loaded library, shared by the Modules opened on its path.
type moduleEntry struct {
	path   string
	handle C.TVMFFIObjectHandle
	opens  int // guarded by modulesMu
}

var (
	modulesMu sync.Mutex
	modules   = map[string]*moduleEntry{}
)

// Open loads the TVM module at path, or shares the one already loaded from it.
func Open(path string) (*Module, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %q: %w", path, err)
	}
	modulesMu.Lock()
	defer modulesMu.Unlock()
	if e, ok := modules[abs]; ok {
		e.opens++
		return &Module{entry: e}, nil
	}
	// Checked here so that the common mistakes get clear errors, not the loader's.
	st, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("dsoop: library %s is a directory", abs)
	}
	if err := Init(); err != nil {
		return nil, err
	}
	cpath := C.CString(abs)
	defer C.free(unsafe.Pointer(cpath))
	var handle C.TVMFFIObjectHandle
	var cerr C.DsoopError
	if C.dsoop_module_load(cpath, &handle, &cerr) != 0 {
		return nil, fmt.Errorf("dsoop: cannot load library %s: %w", abs, takeError(&cerr))
	}
	e := &moduleEntry{path: abs, handle: handle, opens: 1}
	modules[abs] = e
	return &Module{entry: e}, nil
}

// Path is the absolute path the module was loaded from.
func (m *Module) Path() string { return m.entry.path }

// Func looks up a function of the module (or of the modules it imports).
func (m *Module) Func(name string) (*Func, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.DsoopError
	var fn C.DsoopFunction
	switch C.dsoop_module_get_function(m.entry.handle, cname, &fn, &cerr) {
	case 1:
		return newFunc(name, m.entry.path, fn), nil
	case 0:
		return nil, fmt.Errorf("dsoop: library %s: %w: %q", m.entry.path, ErrFunctionNotFound, name)
	default:
		return nil, fmt.Errorf("dsoop: library %s: function %q: %w", m.entry.path, name, takeError(&cerr))
	}
}

// Close releases this Module; the library is released with the last one open on
// its path. Close is idempotent.
func (m *Module) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	modulesMu.Lock()
	defer modulesMu.Unlock()
	m.entry.opens--
	if m.entry.opens == 0 {
		delete(modules, m.entry.path)
		C.dsoop_object_release(m.entry.handle)
	}
	return nil
}
