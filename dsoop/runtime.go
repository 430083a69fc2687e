// Package dsoop loads TVM modules (libraries made by TVM's export_library, or any
// library exporting TVM-FFI functions) and calls their functions on DLPack tensors.
//
// The calls go through the C code in dsoop.c: Go resolves modules and functions
// once, and a call is a single C call of the TVM function pointer. The TensorFlow
// kernels use the same C code on their per-call path without entering Go.
package dsoop

/*
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// LibraryPathEnv names the environment variable listing the folders (separated by
// ':') that hold libtvm_ffi.so and, for tvm.compile'd modules, libtvm_runtime.so.
// The Python package sets it from the installed tvm_ffi and tvm packages when unset.
const LibraryPathEnv = "TVM_LIBRARY_PATH"

const (
	ffiLibraryName     = "libtvm_ffi.so"
	runtimeLibraryName = "libtvm_runtime.so"
)

// ErrRuntimeNotFound means the TVM-FFI runtime library could not be opened.
var ErrRuntimeNotFound = errors.New("TVM-FFI runtime (" + ffiLibraryName + ") not found")

var (
	initMu  sync.Mutex
	initErr error
	inited  bool
)

// Init opens the TVM-FFI runtime (and the TVM runtime when present) with
// RTLD_GLOBAL. Open calls it; call it yourself only to surface the error early.
// A failure is remembered: later calls return the same error.
func Init() error {
	initMu.Lock()
	defer initMu.Unlock()
	if inited {
		return initErr
	}
	inited = true
	initErr = initRuntime()
	return initErr
}

func initRuntime() error {
	ffiLib, runtimeLib, err := findLibraries(getenv(LibraryPathEnv))
	if err != nil {
		return err
	}
	cFFI, cRuntime := C.CString(ffiLib), C.CString(runtimeLib)
	defer C.free(unsafe.Pointer(cFFI))
	defer C.free(unsafe.Pointer(cRuntime))
	var cerr C.DsoopError
	if C.dsoop_runtime_init(cFFI, cRuntime, &cerr) != 0 {
		err := takeError(&cerr)
		return fmt.Errorf("dsoop: %w: %w", ErrRuntimeNotFound, err)
	}
	return nil
}

// findLibraries picks the runtime libraries from the folders of searchPath. With
// an empty search path it leaves the choice to the dynamic loader, which also finds
// a libtvm_ffi.so that the process has already loaded (as `import tvm_ffi` does).
func findLibraries(searchPath string) (ffiLib, runtimeLib string, err error) {
	if searchPath == "" {
		return ffiLibraryName, "", nil
	}
	for _, dir := range filepath.SplitList(searchPath) {
		if dir == "" {
			continue
		}
		if ffiLib == "" && isFile(filepath.Join(dir, ffiLibraryName)) {
			ffiLib = filepath.Join(dir, ffiLibraryName)
		}
		if runtimeLib == "" && isFile(filepath.Join(dir, runtimeLibraryName)) {
			runtimeLib = filepath.Join(dir, runtimeLibraryName)
		}
	}
	if ffiLib == "" {
		return "", "", fmt.Errorf("dsoop: %w in %s=%s (install apache-tvm-ffi, or point %s at the folder holding %s)",
			ErrRuntimeNotFound, LibraryPathEnv, searchPath, LibraryPathEnv, ffiLibraryName)
	}
	return ffiLib, runtimeLib, nil
}

// getenv reads the live C environment. Go's os.Getenv would not do here: in a
// c-shared library it sees the environment as it was at process start, not what
// the host (Python's os.environ, say) set before loading us.
func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.GoString(C.getenv(cname))
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// Error is a failure reported by TVM: its error kind ("ValueError",
// "RuntimeError", ...) and message.
type Error struct {
	Kind    string
	Message string
}

func (e *Error) Error() string { return e.Kind + ": " + e.Message }

// takeError converts and frees a C error.
func takeError(cerr *C.DsoopError) *Error {
	defer C.dsoop_error_clear(cerr)
	e := &Error{Kind: C.GoString(cerr.kind), Message: strings.TrimSpace(C.GoString(cerr.message))}
	if e.Kind == "" {
		e.Kind = "RuntimeError"
	}
	return e
}
