package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
#include "legacy.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// Module is an open TVM module. A library is loaded once per process per path:
// every Open of the same file shares one loaded module, which is released when
// the last Module opened on it is closed. Close a Module when done; a finaliser
// closes it otherwise. Funcs and VMFuncs keep their library loaded on their own,
// so closing a Module does not invalidate those taken from it; the library is
// unloaded, and its sealed copy closed, with the last of them.
type Module struct {
	entry *moduleEntry
	ref   *moduleRef
}

// moduleRef is a Module's open of its entry, apart from Module so that the
// finaliser (a cleanup on Module) can close it without resurrecting Module.
type moduleRef struct {
	mu     sync.RWMutex // Close waits for lookups in flight
	entry  *moduleEntry
	closed bool
}

// moduleEntry is one loaded library, shared by the Modules opened on its path.
type moduleEntry struct {
	path   string
	stat   os.FileInfo               // of the file the library was read from, then
	sealed *sealedLibrary            // the copy it was loaded from: its digest, its data symbols
	handle C.TVMFFIObjectHandle      // the module TVM's loader made; nil for a legacy library
	legacy *C.DsoopLegacyLibrary     // a library of TVM 0.8-0.20, loaded by legacy.c; else nil
	isVM   bool                      // holds a Relax VM executable (a whole model)
	graph  *graphModel               // a relay.build model over legacy's functions; else nil
	pools  map[dlpack.Device]*vmPool // the model's VM instances by device; guarded by poolsMu
	opens  int                       // guarded by modulesMu

	funcsMu sync.Mutex
	funcs   map[string]C.DsoopFunction // looked up so far, one object per name, released with the entry
}

// newModule makes a Module of one more open of e, which is counted already.
func newModule(e *moduleEntry) *Module {
	m := &Module{entry: e, ref: &moduleRef{entry: e}}
	runtime.AddCleanup(m, (*moduleRef).close, m.ref)
	return m
}

// Path is the absolute path the module was loaded from.
func (m *Module) Path() string { return m.entry.path }

// SHA256 is the hex SHA-256 of the bytes loaded: the file as read into the sealed copy.
func (m *Module) SHA256() string { return m.entry.sealed.digest }

// CPULevel is the x86-64 level of the code loaded from a portable library
// (tf_op.compile's default target): the highest this CPU runs, within
// TVMDSOOP_CPU_LEVEL; "" for a library that holds one build.
func (m *Module) CPULevel() string { return m.entry.sealed.level }

// ffiSymbolPrefix begins the symbol of every function a library exports to
// TVM-FFI (TVM_FFI_DLL_EXPORT_TYPED_FUNC, tvm.compile's functions).
const ffiSymbolPrefix = "__tvm_ffi_"

// reservedNames and reservedPrefixes are the names whose __tvm_ffi_<name>
// symbol TVM keeps for itself. From apache-tvm-ffi's include/tvm/ffi/extra/module.h
// (namespace symbol: "special symbols have one extra _ prefix to avoid conflict
// with user symbols"), function.h and extra/cuda/cubin_launcher.h:
//   - __tvm_ffi__library_ctx, __tvm_ffi__library_bin: the library's context
//     pointer and its embedded modules (data);
//   - __tvm_ffi__metadata_<f>, __tvm_ffi__doc_<f>: getters of a function's type
//     schema and docstring (TVM_FFI_DLL_EXPORT_TYPED_FUNC), not the function;
//   - __tvm_ffi__cubin_<name>: CUDA binaries embedded with TVM_FFI_EMBED_CUBIN (data).
//
// TVM 0.21 named the first two __tvm_ffi_library_ctx and __tvm_ffi_library_bin
// (include/tvm/runtime/module.h at v0.21.0), which the same lookup reaches as
// "library_ctx" and "library_bin". TVM up to 0.21 looked symbols up by their
// bare names, and its own are all __tvm... (__tvm_main__, __tvm_module_ctx,
// __tvm_dev_mblob, __tvm_set_device, ...: v0.20.0's module.h); C reserves names
// beginning with two underscores for the implementation, so none is a user's.
//
// "main" (__tvm_ffi_main) is not reserved: it is the module's entry function,
// code that tvm.compile exports for its user.
var (
	reservedNames    = map[string]bool{"_library_ctx": true, "_library_bin": true, "library_ctx": true, "library_bin": true}
	reservedPrefixes = []string{"_metadata_", "_doc_", "_cubin_", "__tvm"}
)

// isReservedName reports whether name reaches a symbol TVM keeps for itself.
func isReservedName(name string) bool {
	return reservedNames[name] || slices.ContainsFunc(reservedPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// Func looks up a function of the module (or of the modules it imports). A name
// TVM keeps for its own symbols is refused with ErrReservedName, and one whose
// symbol is data with ErrNotCode.
func (m *Module) Func(name string) (*Func, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("dsoop: library %s: bad function name %q", m.entry.path, name)
	}
	if isReservedName(name) {
		return nil, fmt.Errorf("dsoop: library %s: %q: %w (TVM-FFI looks it up as %s%s)", m.entry.path, name, ErrReservedName, ffiSymbolPrefix, name)
	}
	if m.entry.sealed.notCode[name] {
		return nil, fmt.Errorf("dsoop: library %s: %q: %w (%s%s)", m.entry.path, name, ErrNotCode, ffiSymbolPrefix, name)
	}
	m.ref.mu.RLock()
	defer m.ref.mu.RUnlock()
	if m.ref.closed {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	fn, found, err := m.entry.function(name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("dsoop: library %s: function %q: %w", m.entry.path, name, err)
	case !found:
		return nil, fmt.Errorf("dsoop: library %s: %w: %q", m.entry.path, ErrFunctionNotFound, name)
	}
	return newFunc(name, m.entry.path, fn), nil
}

// function gives a new reference to the library's function name. The module is
// asked once per name: later lookups share its function object, so that the
// TensorFlow kernels of one function, however many, call through one object
// that stays in cache (a call reads the object's function pointer).
func (e *moduleEntry) function(name string) (fn C.DsoopFunction, found bool, err error) {
	e.funcsMu.Lock()
	defer e.funcsMu.Unlock()
	fn, found = e.funcs[name]
	if !found {
		if fn, found, err = e.lookUp(name); !found || err != nil {
			return fn, found, err
		}
		if e.funcs == nil {
			e.funcs = map[string]C.DsoopFunction{}
		}
		e.funcs[name] = fn // the entry's reference
	}
	C.dsoop_object_retain(fn.handle)
	return fn, true, nil
}

// lookUp asks the library for a new function object: TVM's loader's module, or
// legacy.c for a library of TVM 0.8-0.20.
func (e *moduleEntry) lookUp(name string) (fn C.DsoopFunction, found bool, err error) {
	// Of a legacy library, only the functions it exports itself: its loader would
	// also find its data, and the functions of the libraries it links (libc's).
	if e.legacy != nil && !e.sealed.legacy.functions[name] {
		return fn, false, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.DsoopError
	if e.legacy != nil {
		if C.dsoop_legacy_get_function(e.legacy, cname, &fn, &cerr) != 0 {
			return fn, false, takeError(&cerr)
		}
		return fn, true, nil
	}
	switch C.dsoop_module_get_function(e.handle, cname, &fn, &cerr) {
	case 0:
		return fn, false, nil
	case 1:
		cpath := C.CString(e.sealed.procPath()) // what TVM's loader opened
		defer C.free(unsafe.Pointer(cpath))
		C.dsoop_function_use_symbol(e.handle, cpath, cname, &fn)
		return fn, true, nil
	default:
		return fn, false, takeError(&cerr)
	}
}

// Close releases this Module; the library is released with the last one open on
// its path. Close is idempotent.
func (m *Module) Close() error {
	m.ref.close()
	return nil
}

func (r *moduleRef) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	modulesMu.Lock()
	defer modulesMu.Unlock()
	e := r.entry
	e.opens--
	if e.opens > 0 {
		return
	}
	if modules[e.path] == e { // not if a rebuilt file replaced it there
		delete(modules, e.path)
	}
	poolsMu.Lock()
	pools := e.pools
	e.pools = nil
	poolsMu.Unlock()
	for _, p := range pools {
		p.release() // VMFuncs still open keep theirs
	}
	poolsMu.Lock()
	e.graph.close() // unless a pool took it over
	poolsMu.Unlock()
	e.funcsMu.Lock()
	funcs := e.funcs
	e.funcs = nil
	e.funcsMu.Unlock()
	for _, fn := range funcs {
		C.dsoop_object_release(fn.handle) // Funcs still open keep theirs
	}
	if e.legacy != nil {
		C.dsoop_legacy_release(e.legacy) // its Funcs still open keep it loaded
	} else {
		C.dsoop_object_release(e.handle)
	}
	// Unloaded now, unless Funcs or VMFuncs keep it: its memfd goes
	// with the last of them (sealedLibrary.close).
	e.sealed.close()
}
