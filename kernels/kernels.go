// Package kernels holds the TVMDSOOp TensorFlow op, and TvmDsoOp (the op of
// old TVM), in C++ against TensorFlow's kernel API, one concept a file:
//
//   - ops.cc: the op definitions and their shape functions
//   - tvm_dso_op_kernel.cc, legacy_kernel.cc: each op's kernel, with its CPU
//     and GPU registrations
//   - call.h: what both kernels share: resolving the function, the per-call path
//   - resolved.h: a resolved function, one Resolved per function for the process
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
// op's path is resolve, called at a kernel's first call of a library.
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

// tvmdsoopResolve loads the module at libPath (once per process) and writes
// what the kernel calls for funcName into out: a new reference to a plain
// function, or, for a whole model, the pool of VM instances on the kernel's
// device (made at its first use) and the function's index and arity there. A
// non-empty sha256 (hex) is the digest the library must have. graph, when not
// NULL, makes the model the library's relay.build graph with those files. On
// failure it returns a TensorFlow status code and a malloc'ed message for the
// caller to free.
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
		return resolve(C.GoString(libPath), C.GoString(funcName), C.GoString(sha256), files, device, allowModels != 0, out)
	})
	if code != 0 {
		*errMsg = C.CString(msg)
	}
	return C.int(code)
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
// their files and digests: kept, as libraries are, for the life of the
// process, so that every kernel of a model shares its executor and params.
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

// resolve keeps the library it opens loaded for the life of the process: later
// kernels share it (and its VM pools).
func resolve(libPath, funcName, sha256 string, graph *graphFiles, device dlpack.Device, allowModels bool, out *C.TvmdsoopTarget) error {
	// The digest is checked on the bytes read, before any of them runs.
	module, err := dsoop.OpenPinned(libPath, sha256)
	if err != nil {
		return err
	}
	defer module.Close()
	if err := native.KeepLoaded(module); err != nil {
		return err
	}
	if graph != nil {
		if module, err = graphModel(module, *graph); err != nil {
			return err
		}
	}
	*out = C.TvmdsoopTarget{arity: -1}
	if module.IsModel() {
		if !allowModels {
			return fmt.Errorf("%w: the library at %s is a whole model (a Relax VM executable or a relay.build graph); TvmDsoOp calls plain functions only, use TVMDSOOp", errModelNotAllowed, module.Path())
		}
		fn, err := module.VMFunc(funcName, device)
		if err != nil {
			return err
		}
		// The kernel takes its own reference to the pool; this VMFunc is not needed past here.
		defer fn.Close()
		pool, index, err := native.RetainVMFunc(fn)
		if err != nil {
			return err
		}
		out.pool = (*C.DsoopVMPool)(pool)
		out.vm_index = C.int32_t(index)
		out.arity = C.int64_t(fn.Arity())
		return nil
	}
	fn, err := module.Func(funcName)
	if err != nil {
		return err
	}
	defer fn.Close()
	return native.RetainFunc(fn, unsafe.Pointer(&out.fn))
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
