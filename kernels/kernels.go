// Package kernels holds the TVMDSOOp TensorFlow op, and TvmDsoOp (the op of
// old TVM), in C++ against TensorFlow's kernel API, one concept a file:
//
//   - ops.cc: the op definitions and their shape functions
//   - tvm_dso_op_kernel.cc, legacy_kernel.cc: each op's kernel, with its CPU
//     and GPU registrations
//   - call.h: what both kernels share: resolving the function, the per-call path
//   - eager_call.cc: tf_op's eager calls of a returning function without the op
//     (TVMDSOOpEager*, through ctypes), resolved as a kernel resolves it
//   - resolved.h: a resolved function, one Resolved per function, counted
//   - placement.h: CPU and GPU placement (buffers, copies, TF's stream)
//   - dlpack_tensor.h: TF tensors in DLPack's terms
//   - returned_output.h: what a returning function gave back, as the op's outputs
//   - output_pool.h: the output buffers a CPU kernel keeps for its next calls
//   - aligned_buffer.h: scratch memory at TVM's alignment
//   - status.h: TVM errors as TF statuses, and the per-call checks
//   - target.h: what Go resolves for a kernel (this file's tvmdsoopResolve)
//   - tf_compat.h: what differs between the TF releases it builds against
//   - auto_pass.cc: tf_op.auto's graph pass, which puts TVMDSOOpCluster ops in
//     place of the parts of a graph TVM can take
//   - cluster_kernel.cc: TVMDSOOpCluster's kernel: a compile per input shape,
//     timed against TF, with TF's run of the part as the fallback
//   - auto_settings.h: the pass's and the cluster kernel's settings
//   - auto.go: their calls into Go (package auto), and tf_op.auto's into them
//
// The shared pieces are in namespace tvmdsoop::internal; call.h says which
// have internal linkage, and why.
//
// Linking this package into a binary registers the op: the registration runs in
// C++ static initialisers, with no Go call, because a c-shared library's Go
// runtime is not ready while the library is being dlopened. The only Go on the
// op's path is resolve, called at a kernel's first call of a library, and
// release, when the last kernel of a function is destroyed.
package kernels

/*
#cgo CFLAGS: -I${SRCDIR}/.. -I${SRCDIR}/../third_party/tvm-ffi/include
#cgo CXXFLAGS: -std=c++17 -I${SRCDIR}/.. -I${SRCDIR}/../third_party/tvm-ffi/include
#include <stdlib.h>
#include "kernels/target.h"
#include "tensorflow/c/tf_status.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime/cgo"
	"strings"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

// TensorFlow status codes the resolution errors map to, from TF's C API (the
// kernel hands them to TF as absl::StatusCode, which has the same values).
const (
	codeInvalidArgument    = C.TF_INVALID_ARGUMENT
	codeUnimplemented      = C.TF_UNIMPLEMENTED
	codeNotFound           = C.TF_NOT_FOUND
	codePermissionDenied   = C.TF_PERMISSION_DENIED
	codeFailedPrecondition = C.TF_FAILED_PRECONDITION
	codeInternal           = C.TF_INTERNAL
)

// errModelNotAllowed refuses a whole model to the op of old TVM, which calls
// plain functions only.
var errModelNotAllowed = errors.New("not a library of plain functions")

// tvmdsoopResolve loads the module at libPath (shared with every other user of
// the unchanged file while one is left) and writes what the kernel calls for
// funcName into out: a plain function, or, for a whole model, the pool of VM
// instances on the kernel's device (made at its first use) and the function's
// index and arity there; and out.holder, what keeps them valid, which the
// kernel gives back with tvmdsoopRelease. A non-empty sha256 (hex) is the
// digest the library must have. graph, when not NULL, makes the model the
// library's relay.build graph with those files. On failure it returns a
// TensorFlow status code and a malloc'ed message for the caller to free, and
// holds nothing.
//
//export tvmdsoopResolve
func tvmdsoopResolve(libPath, funcName, sha256 *C.char, graph *C.TvmdsoopGraphFiles, deviceType, deviceID C.int32_t, allowModels C.int, out *C.TvmdsoopTarget, errMsg **C.char) C.int {
	code, msg := status(func() error {
		device := dlpack.Device{Type: dlpack.DeviceType(deviceType), ID: int32(deviceID)}
		var files *graphFiles
		if graph != nil {
			files = &graphFiles{graph: C.GoString(graph.graph), graphSHA256: C.GoString(graph.graph_sha256),
				params: C.GoString(graph.params), paramsSHA256: C.GoString(graph.params_sha256)}
		}
		t, err := resolve(C.GoString(libPath), C.GoString(funcName), C.GoString(sha256), files, device, allowModels != 0)
		if err != nil {
			return err
		}
		*out = C.TvmdsoopTarget{
			fn:       t.fn,
			pool:     (*C.DsoopVMPool)(t.pool),
			vm_index: C.int32_t(t.index),
			arity:    C.int64_t(t.arity),
			holder:   C.uintptr_t(cgo.NewHandle(t.held)),
		}
		return nil
	})
	if code != 0 {
		*errMsg = C.CString(msg)
	}
	return C.int(code)
}

// tvmdsoopRelease gives back what tvmdsoopResolve's target held: the library
// is unloaded with its last user. The kernels call it from TensorFlow's threads
// when the last kernel of a function is destroyed. A panic is not let unwind
// into them: there is no one to tell, so the library stays loaded.
//
//export tvmdsoopRelease
func tvmdsoopRelease(holder C.uintptr_t) {
	defer func() { _ = recover() }()
	h := cgo.Handle(holder)
	kept := h.Value().(*held)
	h.Delete()
	kept.release()
}

// status runs resolution and gives its TensorFlow status code (0 for OK) and
// message. A Go panic must not unwind into TensorFlow's C++ frames: it is
// recovered, and reported as the bug it is.
func status(resolution func() error) (code int, msg string) {
	defer func() {
		if r := recover(); r != nil {
			code, msg = codeInternal, fmt.Sprintf("internal error: %v", r)
		}
	}()
	if err := resolution(); err != nil {
		return statusCode(err), describe(err)
	}
	return 0, ""
}

// describe words an error for a message that already names the library and the
// function (the kernel's prefix), so the common cases do not repeat them.
func describe(err error) string {
	var notFound *dsoop.FunctionNotFoundError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "the library file does not exist"
	case errors.Is(err, dsoop.ErrReservedName):
		return "the name is reserved for TVM's own symbols, not a function of the library: refusing to look it up"
	case errors.Is(err, dsoop.ErrNotCode):
		return "the library's symbol of that name is data, not a function: refusing to call it"
	case errors.As(err, &notFound) && notFound.Available != nil:
		return "the model has no function of that name; its functions are " + strings.Join(notFound.Available, ", ")
	case errors.Is(err, dsoop.ErrFunctionNotFound):
		return "the library has no function of that name"
	default:
		return err.Error()
	}
}

// graphFiles are a three-file relay.build model's graph and params.
type graphFiles struct{ graph, graphSHA256, params, paramsSHA256 string }

// graphModels are the relay.build models of three files made so far, by
// their files and digests, so that every kernel of a model shares its
// executor and params: kept for the life of the process, and their libraries
// with them (unlike other libraries, which leave with their last kernel).
var graphModels = struct {
	sync.Mutex
	m map[graphFiles]*dsoop.Module
}{m: map[graphFiles]*dsoop.Module{}}

// graphModel is the model of the library's graph with files, made at the
// first use of those files (by their paths, and digests when given).
func graphModel(library *dsoop.Module, files graphFiles) (*dsoop.Module, error) {
	key := files
	key.graph = library.Path() + "\x00" + files.graph // the same graph over another library is another model
	graphModels.Lock()
	defer graphModels.Unlock()
	if m, ok := graphModels.m[key]; ok {
		return m, nil
	}
	m, err := library.GraphFiles(files.graph, files.graphSHA256, files.params, files.paramsSHA256)
	if err != nil {
		return nil, err
	}
	graphModels.m[key] = m
	return m, nil
}

// target is what resolve gives a kernel to call: the native objects, valid
// while held is not released.
type target struct {
	fn    C.DsoopFunction // a plain function; zero for a model's
	pool  unsafe.Pointer  // a model's function: its pool, and its index there
	index int32
	arity int64 // the model function's number of inputs; -1 for plain functions
	held  *held
}

// held keeps a resolved function and its library: the Module keeps the
// library's one loaded copy (and a model's pools) for every later kernel of
// it, the Func or VMFunc the object the kernels call.
type held struct {
	module *dsoop.Module
	fn     *dsoop.Func
	vmFunc *dsoop.VMFunc
}

// release closes the function before the module: the module's close, the
// last use, then finds the library unloaded and closes its sealed copy.
func (h *held) release() {
	if h.fn != nil {
		h.fn.Close()
	}
	if h.vmFunc != nil {
		h.vmFunc.Close()
	}
	h.module.Close()
}

// resolve opens the library and its function for a kernel, held until the
// target's held is released; on failure it holds nothing.
func resolve(libPath, funcName, sha256 string, graph *graphFiles, device dlpack.Device, allowModels bool) (t target, err error) {
	// The digest is checked on the bytes read, before any of them runs.
	module, err := dsoop.OpenPinned(libPath, sha256)
	if err != nil {
		return t, err
	}
	h := &held{module: module}
	defer func() {
		if err != nil {
			h.release()
		}
	}()
	if graph != nil {
		if module, err = graphModel(module, *graph); err != nil {
			return t, err
		}
	}
	t.arity = -1
	if module.IsModel() {
		if !allowModels {
			return t, fmt.Errorf("%w: the library at %s is a whole model (a Relax VM executable or a relay.build graph); TvmDsoOp calls plain functions only, use TVMDSOOp", errModelNotAllowed, module.Path())
		}
		if h.vmFunc, err = module.VMFunc(funcName, device); err != nil {
			return t, err
		}
		pool, index, err := native.BorrowVMFunc(h.vmFunc)
		if err != nil {
			return t, err
		}
		t.pool, t.index, t.arity, t.held = pool, index, int64(h.vmFunc.Arity()), h
		return t, nil
	}
	if h.fn, err = module.Func(funcName); err != nil {
		return t, err
	}
	if err := native.BorrowFunc(h.fn, unsafe.Pointer(&t.fn)); err != nil {
		return t, err
	}
	t.held = h
	return t, nil
}

func statusCode(err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, dsoop.ErrFunctionNotFound):
		return codeNotFound
	case errors.Is(err, dsoop.ErrRuntimeNotFound), errors.Is(err, dsoop.ErrRuntimeVersion),
		errors.Is(err, dsoop.ErrTVMRuntimeNotLoaded),
		errors.Is(err, dsoop.ErrCUDARuntimeNotLoaded),
		errors.Is(err, dsoop.ErrCUDASourceNotCompiled), errors.Is(err, dsoop.ErrUnsupportedCPU),
		errors.Is(err, dsoop.ErrCUDAModelOnCPU):
		return codeFailedPrecondition
	case errors.Is(err, dsoop.ErrDigestMismatch), errors.Is(err, dsoop.ErrNotAllowed):
		return codePermissionDenied
	case errors.Is(err, errModelNotAllowed):
		return codeFailedPrecondition
	case errors.Is(err, dsoop.ErrLegacyUnsupported):
		return codeUnimplemented
	default:
		return codeInvalidArgument
	}
}
