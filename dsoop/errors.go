package dsoop

/*
#include "dsoop.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
)

// The sentinel errors come wrapped with what failed and why: test for them
// with errors.Is.

// The runtime libraries: finding them, and what a library needs of them.

// ErrRuntimeNotFound means the TVM-FFI runtime library could not be opened.
var ErrRuntimeNotFound = errors.New("TVM-FFI runtime (" + ffiLibraryName + ") not found")

// ErrRuntimeVersion means the TVM-FFI runtime is of another major.minor version
// than the TVM-FFI headers dsoop was compiled with. TVM-FFI is at 0.x, where a
// minor release may change the C ABI, so such a runtime is refused before
// anything of it but its version is called.
var ErrRuntimeVersion = errors.New("TVM-FFI runtime of another version than dsoop was built for")

// ErrTVMRuntimeNotLoaded means a library needs TVM's runtime (libtvm_runtime.so),
// which was not found on the search path: it calls through pointers that the
// runtime fills at load (workspace memory, parallel loops: TVMBackendParallelLaunch,
// ...), or it embeds a module that the runtime loads (a Relax VM executable). A
// function called through such a pointer left unset would jump to address zero:
// the library is refused before any of its functions runs.
var ErrTVMRuntimeNotLoaded = errors.New("the library needs TVM's runtime (" + runtimeLibraryName + "), which was not found")

// ErrLegacyNeedsRuntime is ErrTVMRuntimeNotLoaded, as a library built by TVM
// 0.8-0.20 gives it: it uses workspace memory or parallel loops.
//
// Deprecated: use ErrTVMRuntimeNotLoaded, which libraries of every TVM give.
var ErrLegacyNeedsRuntime = ErrTVMRuntimeNotLoaded

// ErrCUDARuntimeNotLoaded means a library holds CUDA code but TVM's CUDA runtime,
// which loads such code, could not be opened (the error says why).
var ErrCUDARuntimeNotLoaded = errors.New("TVM's CUDA runtime did not load")

// ErrCUDASourceNotCompiled means a library carries CUDA C++ source where compiled
// GPU code was expected: TVM compiled it on a machine without a CUDA driver, and
// compiles such source at load only through a callback of its Python package.
var ErrCUDASourceNotCompiled = errors.New("the library carries CUDA source, not compiled GPU code")

// Opening a library: each refuses it before anything of it runs in this process.

// ErrNotAllowed means a library lies outside the folders of AllowedDirsEnv.
var ErrNotAllowed = errors.New("library outside the allowed folders")

// ErrNotALibrary means a file is not a shared library this process can load:
// not ELF, another class or machine, not a shared object, or with headers that
// point outside the file. It is found before anything of the file runs.
var ErrNotALibrary = errors.New("not a loadable shared library")

// ErrDigestMismatch means a library's SHA-256 is not the one asked for: it is
// not the library a model was built with. It is found before anything runs.
var ErrDigestMismatch = errors.New("refusing a library that is not the one the model was built with")

// ErrUnsupportedCPU means a library needs instructions this CPU lacks: it was
// compiled for a newer CPU (tf_op.compile with a host-tuned target, on another
// machine). Running it would die of an illegal instruction; it is refused
// before anything of it runs.
var ErrUnsupportedCPU = errors.New("the library needs CPU features this CPU lacks")

// ErrProbeFailed means loading a library in a separate process crashed or hung
// it: the library is refused in this one.
var ErrProbeFailed = errors.New("loading the library in a separate process failed")

// ErrLegacyUnsupported means a library built by TVM 0.8-0.21 that dsoop does not
// run: it embeds modules that only the old runtime rebuilt (CUDA code, say), it
// calls back through a context symbol dsoop does not know, or it was built by
// TVM 0.21 (a hybrid of the two ABIs). It is found before anything of it runs.
var ErrLegacyUnsupported = errors.New("a library of TVM <= 0.21 that dsoop cannot run")

// Looking up and calling functions.

// ErrFunctionNotFound means a module has no function of the requested name.
var ErrFunctionNotFound = errors.New("function not found")

// ErrNotCode means a name's symbol in the library is data, not a function: a
// call would jump into it. It is a kind of ErrFunctionNotFound.
var ErrNotCode = fmt.Errorf("%w: the symbol is data, not code", ErrFunctionNotFound)

// ErrReservedName means a function name is one TVM keeps for its own symbols (a
// library's context and embedded modules, a function's metadata), never a
// function of the library's author.
var ErrReservedName = errors.New("the name is reserved for TVM's own symbols, not a function")

// ErrClosed is returned by calls on a closed Func or Module, wrapped with what
// was closed.
var ErrClosed = errors.New("already closed")

// ErrArity means a model function was called with the wrong number of inputs.
var ErrArity = errors.New("wrong number of inputs")

// ErrCUDAModelOnCPU means a model whose kernels are CUDA code was asked to run on the
// CPU, where its VM would hand host memory to GPU kernels.
var ErrCUDAModelOnCPU = errors.New("the model's kernels are CUDA code: it runs on a CUDA device, not the CPU")

// The error types: a failure TVM reports, and a function a module lacks.

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

// FunctionNotFoundError is the error of a function a module does not have. For a
// whole model (a Relax VM executable), Available lists the model's functions.
type FunctionNotFoundError struct {
	Path, Name string
	Available  []string // nil for libraries of plain functions
}

func (e *FunctionNotFoundError) Error() string {
	msg := fmt.Sprintf("dsoop: library %s: %v: %q", e.Path, ErrFunctionNotFound, e.Name)
	if e.Available != nil {
		msg += "; the model's functions are " + strings.Join(e.Available, ", ")
	}
	return msg
}

// Is makes errors.Is(err, ErrFunctionNotFound) hold.
func (e *FunctionNotFoundError) Is(target error) bool { return target == ErrFunctionNotFound }
