package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"

// Fills one packed argument with a DLTensor pointer (cgo cannot reach the union).
static void dsoop_set_tensor_arg(TVMFFIAny* args, int i, DLTensor* t) {
  args[i].type_index = kTVMFFIDLTensorPtr;
  args[i].zero_padding = 0;
  args[i].v_ptr = t;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// Func is a function of a TVM module, resolved once and callable many times from
// any goroutine. Close it when done; a finaliser releases it otherwise.
type Func struct {
	name   string
	module *Module
	ref    *funcRef
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
	}
}

func newFunc(name string, module *Module, fn C.DsoopFunction) *Func {
	f := &Func{name: name, module: module, ref: &funcRef{fn: fn}}
	runtime.AddCleanup(f, (*funcRef).close, f.ref)
	return f
}

// Name is the function's name in its module.
func (f *Func) Name() string { return f.name }

// Module is the module the function belongs to.
func (f *Func) Module() *Module { return f.module }

var errClosed = errors.New("dsoop: function is closed")

// Call calls the function with tensors, in order: by TVM's destination-passing
// convention, inputs first, then the outputs it writes. The tensors' memory is
// passed without a copy; Go memory is pinned for the duration of the call.
func (f *Func) Call(tensors ...*dlpack.Tensor) error {
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return errClosed
	}
	n := len(tensors)
	// DLTensors and shapes live in C memory: cgo forbids C code from keeping Go
	// pointers to Go memory that itself holds Go pointers.
	var cshapes, cstrides int
	for _, t := range tensors {
		cshapes += len(t.Shape)
		cstrides += len(t.Strides)
	}
	block := C.calloc(C.size_t(n*int(C.sizeof_DLTensor)+n*int(C.sizeof_TVMFFIAny)+(cshapes+cstrides)*8+8), 1)
	if block == nil {
		return errors.New("dsoop: out of memory")
	}
	defer C.free(block)
	dl := unsafe.Slice((*C.DLTensor)(block), n)
	args := (*C.TVMFFIAny)(unsafe.Add(block, n*int(C.sizeof_DLTensor)))
	dims := unsafe.Slice((*C.int64_t)(unsafe.Add(block, n*int(C.sizeof_DLTensor)+n*int(C.sizeof_TVMFFIAny))), cshapes+cstrides)

	var pinner runtime.Pinner
	defer pinner.Unpin()
	for i, t := range tensors {
		if t == nil {
			return fmt.Errorf("dsoop: %s: argument %d is a nil tensor", f.name, i)
		}
		if t.Data != nil {
			pinner.Pin(t.Data)
		}
		d := &dl[i]
		d.data = t.Data
		d.device = C.DLDevice{device_type: C.DLDeviceType(t.Device.Type), device_id: C.int32_t(t.Device.ID)}
		d.ndim = C.int32_t(len(t.Shape))
		d.dtype = C.DLDataType{code: C.uint8_t(t.DType.Code), bits: C.uint8_t(t.DType.Bits), lanes: C.uint16_t(t.DType.Lanes)}
		d.byte_offset = C.uint64_t(t.ByteOffset)
		if len(t.Shape) > 0 {
			d.shape = &dims[0]
			for j, v := range t.Shape {
				dims[j] = C.int64_t(v)
			}
			dims = dims[len(t.Shape):]
		}
		if len(t.Strides) > 0 {
			d.strides = &dims[0]
			for j, v := range t.Strides {
				dims[j] = C.int64_t(v)
			}
			dims = dims[len(t.Strides):]
		}
		C.dsoop_set_tensor_arg(args, C.int(i), d)
	}
	var cerr C.DsoopError
	if C.dsoop_function_call(&f.ref.fn, args, C.int32_t(n), &cerr) != 0 {
		return fmt.Errorf("dsoop: %s in %s: %w", f.name, f.module.path, takeError(&cerr))
	}
	return nil
}

// Close releases the function. Calls after Close fail; Close is idempotent.
func (f *Func) Close() error {
	f.ref.close()
	return nil
}

// RetainNative writes a new reference to the function into dst, which must point
// to a DsoopFunction (dsoop.h). The holder owns it and releases it with
// dsoop_object_release(dst->handle). This is how the TensorFlow kernels get a
// function they call from C with no Go on the path.
func (f *Func) RetainNative(dst unsafe.Pointer) error {
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return errClosed
	}
	C.dsoop_function_retain(&f.ref.fn, (*C.DsoopFunction)(dst))
	return nil
}
