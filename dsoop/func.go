package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// Func is a function of a TVM module, resolved once and callable many times from
// any goroutine. Close it when done; a finaliser releases it otherwise. A Func
// keeps its library loaded even after its Module is closed.
type Func struct {
	name string
	path string
	ref  *funcRef
}

// funcRef owns the reference to the TVM function object. It is apart from Func so
// that the finaliser (a cleanup on Func) can release it without resurrecting Func.
type funcRef struct {
	mu     sync.RWMutex // Close waits for calls in flight
	fn     C.DsoopFunction
	closed bool
}

func (r *funcRef) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		C.dsoop_object_release(r.fn.handle)
		r.closed = true
		sweepLoaderFiles() // its library's last reference may have gone with it
	}
}

func newFunc(name, path string, fn C.DsoopFunction) *Func {
	f := &Func{name: name, path: path, ref: &funcRef{fn: fn}}
	runtime.AddCleanup(f, (*funcRef).close, f.ref)
	return f
}

// Name is the function's name in its module.
func (f *Func) Name() string { return f.name }

// Call calls the function for its effect. By TVM's destination-passing
// convention, tensor functions take their inputs, then the outputs they write.
//
// Arguments may be *dlpack.Tensor (or dlpack.Tensor), Go integers, float32 and
// float64, bool, string, or nil. Tensor memory is passed without a copy, Go memory
// (from dlpack.FromSlice) and foreign memory (C, mmap, device) alike; Go memory
// stays valid for the call, and C must not keep it past the call.
func (f *Func) Call(args ...any) error {
	return f.invoke(args, callMode{})
}

// CallValue calls the function and returns what it returned: nil, int64,
// float64, bool or string.
func (f *Func) CallValue(args ...any) (any, error) {
	var out C.DsoopValue
	if err := f.invoke(args, callMode{value: &out}); err != nil {
		return nil, err
	}
	switch out.type_index {
	case C.kTVMFFIInt:
		return int64(out.v_int), nil
	case C.kTVMFFIBool:
		return out.v_int != 0, nil
	case C.kTVMFFIFloat:
		return float64(out.v_float), nil
	case C.kTVMFFIStr:
		defer C.free(unsafe.Pointer(out.v_str))
		return C.GoStringN(out.v_str, C.int(out.str_len)), nil
	default:
		return nil, nil
	}
}

// CallOn calls the function with TVM's current stream for device set to stream
// (a CUstream, for CUDA), restoring the previous one after. TVM kernels launch on
// that stream, ordered after the work already queued there, with no
// synchronisation: the call may return before the device has finished.
func (f *Func) CallOn(device dlpack.Device, stream unsafe.Pointer, args ...any) error {
	return f.invoke(args, callMode{onStream: true, device: device, stream: stream})
}

// callMode says which C call a Func call makes and what it needs.
type callMode struct {
	value    *C.DsoopValue // CallValue: where the result goes
	onStream bool          // CallOn, with device and stream
	device   dlpack.Device
	stream   unsafe.Pointer
}

// invoke packs args and makes the call, holding the function open for the call
// and wrapping failures with the function and library.
func (f *Func) invoke(args []any, mode callMode) error {
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	fr := frames.Get().(*frame)
	defer fr.release()
	if err := fr.pack(args); err != nil {
		return fmt.Errorf("dsoop: %s in %s: %w", f.name, f.path, err)
	}
	if err := fr.call(f.ref.fn, mode); err != nil {
		return fmt.Errorf("dsoop: %s in %s: %w", f.name, f.path, err)
	}
	return nil
}

// ffiAny mirrors TVMFFIAny (c_api.h), whose union cgo cannot reach: a type
// index, 4 bytes of padding, then 8 bytes of value.
type ffiAny struct {
	typeIndex int32
	padding   uint32
	value     uint64
}

// A build-time check that ffiAny matches TVMFFIAny: a mismatch in either
// direction makes the index out of range (or the constant overflow), so it is
// caught by the compiler rather than at start-up inside a host process.
const ffiAnySizeDifference = unsafe.Sizeof(ffiAny{}) - uintptr(C.sizeof_TVMFFIAny)

var _ = [1]struct{}{}[ffiAnySizeDifference]

// Close releases the function. Calls after Close fail; Close is idempotent.
func (f *Func) Close() error {
	f.ref.close()
	return nil
}
