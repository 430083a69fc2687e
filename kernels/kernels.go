// Package kernels holds the TVMDSOOp TensorFlow op: its definition, shape
// function and CPU kernel (tvm_dso_op.cc, C++ against TensorFlow's kernel API).
//
// Linking this package into a binary registers the op: the registration runs in
// C++ static initialisers, with no Go call, because a c-shared library's Go
// runtime is not ready while the library is being dlopened. The only Go on the
// op's path is resolveFunction, called once when TensorFlow constructs a kernel.
package kernels

/*
#cgo CFLAGS: -I${SRCDIR}/..
#cgo CXXFLAGS: -std=c++17 -I${SRCDIR}/..
#include <stdlib.h>
#include "dsoop/dsoop.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// TensorFlow status codes (absl::StatusCode) the resolution errors map to.
const (
	codeInvalidArgument    = 3
	codeNotFound           = 5
	codePermissionDenied   = 7
	codeFailedPrecondition = 9
)

// errWrongLibrary refuses a library whose SHA-256 is not the one the model recorded.
var errWrongLibrary = errors.New("refusing a library that is not the one the model was built with")

// tvmdsoopResolveFunction loads the module at libPath (once per process) and
// writes a new reference to its function funcName into out. A non-empty sha256
// (hex) is the digest the library must have. On failure it returns a TensorFlow
// status code and a malloc'ed message for the caller to free.
//
//export tvmdsoopResolveFunction
func tvmdsoopResolveFunction(libPath, funcName, sha256 *C.char, out *C.DsoopFunction, errMsg **C.char) (code C.int) {
	// A Go panic must not unwind into TensorFlow's C++ frames.
	defer func() {
		if r := recover(); r != nil {
			*errMsg = C.CString(fmt.Sprintf("TVMDSOOp: internal error while resolving the function: %v", r))
			code = codeInvalidArgument
		}
	}()
	err := resolveFunction(C.GoString(libPath), C.GoString(funcName), C.GoString(sha256), unsafe.Pointer(out))
	if err == nil {
		return 0
	}
	*errMsg = C.CString(describe(err))
	return C.int(statusCode(err))
}

// describe words an error for a message that already names the library and the
// function (the kernel's prefix), so the common cases do not repeat them.
func describe(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "the library file does not exist"
	case errors.Is(err, dsoop.ErrFunctionNotFound):
		return "the library has no function of that name"
	default:
		return err.Error()
	}
}

// resolveFunction never closes the Module it opens: the library then stays loaded
// for the life of the process, and later kernels share it.
func resolveFunction(libPath, funcName, sha256 string, out unsafe.Pointer) error {
	module, err := dsoop.Open(libPath)
	if err != nil {
		return err
	}
	if sha256 != "" && !strings.EqualFold(sha256, module.SHA256()) {
		return fmt.Errorf("%w: the library at %s has SHA-256 %s, the model expects %s",
			errWrongLibrary, module.Path(), module.SHA256(), sha256)
	}
	fn, err := module.Func(funcName)
	if err != nil {
		return err
	}
	// The kernel takes its own reference; this Func is not needed past here.
	defer fn.Close()
	return fn.RetainNative(out)
}

func statusCode(err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, dsoop.ErrFunctionNotFound):
		return codeNotFound
	case errors.Is(err, dsoop.ErrRuntimeNotFound), errors.Is(err, dsoop.ErrCUDARuntimeNotLoaded),
		errors.Is(err, dsoop.ErrCUDASourceNotCompiled):
		return codeFailedPrecondition
	case errors.Is(err, errWrongLibrary), errors.Is(err, dsoop.ErrNotAllowed):
		return codePermissionDenied
	default:
		return codeInvalidArgument
	}
}
