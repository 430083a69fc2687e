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

// Module is a loaded TVM module. Modules are loaded once per process per path and
// shared: the native code of a library cannot be safely unloaded, so a Module
// lives as long as the process.
type Module struct {
	path   string
	handle C.TVMFFIObjectHandle
}

var (
	modulesMu sync.Mutex
	modules   = map[string]*Module{}
)

// Open loads the TVM module at path, or returns the one already loaded from it.
func Open(path string) (*Module, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: module %q: %w", path, err)
	}
	modulesMu.Lock()
	defer modulesMu.Unlock()
	if m, ok := modules[abs]; ok {
		return m, nil
	}
	// Checked here so that the common mistake gets os's clear error, not the loader's.
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
	m := &Module{path: abs, handle: handle}
	modules[abs] = m
	return m, nil
}

// Path is the absolute path the module was loaded from.
func (m *Module) Path() string { return m.path }

// Func looks up a function of the module (or of the modules it imports).
func (m *Module) Func(name string) (*Func, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.DsoopError
	var fn C.DsoopFunction
	switch C.dsoop_module_get_function(m.handle, cname, &fn, &cerr) {
	case 1:
	case 0:
		return nil, fmt.Errorf("dsoop: library %s: %w: %q", m.path, ErrFunctionNotFound, name)
	default:
		return nil, fmt.Errorf("dsoop: library %s: function %q: %w", m.path, name, takeError(&cerr))
	}
	return newFunc(name, m, fn), nil
}
