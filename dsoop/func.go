package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
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
	}
}

func newFunc(name, path string, fn C.DsoopFunction) *Func {
	f := &Func{name: name, path: path, ref: &funcRef{fn: fn}}
	runtime.AddCleanup(f, (*funcRef).close, f.ref)
	return f
}

// Name is the function's name in its module.
func (f *Func) Name() string { return f.name }

// ErrClosed is returned by calls on a closed Func or Module.
var ErrClosed = errors.New("dsoop: closed")

// Call calls the function for its effect. By TVM's destination-passing
// convention, tensor functions take their inputs, then the outputs they write.
//
// Arguments may be *dlpack.Tensor (or dlpack.Tensor), Go integers, float32 and
// float64, bool, string, or nil. Tensor memory is passed without a copy: Go memory
// (from dlpack.FromSlice) is pinned for the duration of the call, and foreign
// memory (C, mmap, device) is passed as it is.
func (f *Func) Call(args ...any) error {
	return f.invoke(args, func(cargs *C.TVMFFIAny, n C.int32_t, cerr *C.DsoopError) C.int {
		return C.dsoop_function_call(&f.ref.fn, cargs, n, cerr)
	})
}

// CallValue calls the function and returns what it returned: nil, int64,
// float64, bool or string.
func (f *Func) CallValue(args ...any) (any, error) {
	var out C.DsoopValue
	err := f.invoke(args, func(cargs *C.TVMFFIAny, n C.int32_t, cerr *C.DsoopError) C.int {
		return C.dsoop_function_call_value(&f.ref.fn, cargs, n, &out, cerr)
	})
	if err != nil {
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
	return f.invoke(args, func(cargs *C.TVMFFIAny, n C.int32_t, cerr *C.DsoopError) C.int {
		return C.dsoop_function_call_on_stream(&f.ref.fn, cargs, n,
			C.int32_t(device.Type), C.int32_t(device.ID), stream, cerr)
	})
}

// invoke packs args and runs call on them, holding the function open for the
// call and wrapping failures with the function and library.
func (f *Func) invoke(args []any, call func(cargs *C.TVMFFIAny, n C.int32_t, cerr *C.DsoopError) C.int) error {
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	packed, err := packArgs(args)
	if err != nil {
		return fmt.Errorf("dsoop: %s in %s: %w", f.name, f.path, err)
	}
	defer packed.free()
	var cerr C.DsoopError
	if call(packed.cArgs(), C.int32_t(len(args)), &cerr) != 0 {
		return fmt.Errorf("dsoop: %s in %s: %w", f.name, f.path, takeError(&cerr))
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

// packedArgs is one call's arguments, in Go memory that C reads during the call:
// the packed TVMFFIAny array, the DLTensors and their shapes, and NUL-terminated
// strings. Everything a C pointer reaches is pinned, which is what lets C code
// follow Go pointers (cgo's rules) without a malloc and a copy per call.
type packedArgs struct {
	anys    []ffiAny
	tensors []C.DLTensor
	dims    []C.int64_t
	pinner  runtime.Pinner
}

func (p *packedArgs) free() { p.pinner.Unpin() }

func (p *packedArgs) cArgs() *C.TVMFFIAny {
	if len(p.anys) == 0 {
		return nil
	}
	return (*C.TVMFFIAny)(unsafe.Pointer(&p.anys[0]))
}

// setPointer stores a pointer argument; ptr must already be pinned.
func (p *packedArgs) setPointer(i int, typeIndex int32, ptr unsafe.Pointer) {
	p.anys[i] = ffiAny{typeIndex: typeIndex, value: uint64(uintptr(ptr))}
}

func packArgs(args []any) (*packedArgs, error) {
	numTensors, numDims := 0, 0
	for _, a := range args {
		switch t := a.(type) {
		case *dlpack.Tensor:
			if t != nil {
				numTensors++
				numDims += len(t.Shape) + len(t.Strides)
			}
		case dlpack.Tensor:
			numTensors++
			numDims += len(t.Shape) + len(t.Strides)
		}
	}
	p := &packedArgs{
		anys:    make([]ffiAny, len(args)),
		tensors: make([]C.DLTensor, numTensors),
		dims:    make([]C.int64_t, numDims),
	}
	if numTensors > 0 {
		p.pinner.Pin(&p.tensors[0])
	}
	if numDims > 0 {
		p.pinner.Pin(&p.dims[0])
	}
	tensors, dims := p.tensors, p.dims
	for i, a := range args {
		if v, ok := a.(dlpack.Tensor); ok {
			a = &v
		}
		switch v := a.(type) {
		case *dlpack.Tensor:
			if v == nil {
				p.free()
				return nil, fmt.Errorf("argument %d is a nil tensor", i)
			}
			d := &tensors[0]
			tensors = tensors[1:]
			dims = fillDLTensor(d, v, dims, &p.pinner)
			p.setPointer(i, C.kTVMFFIDLTensorPtr, unsafe.Pointer(d))
		case nil:
			p.anys[i] = ffiAny{typeIndex: C.kTVMFFINone}
		case bool:
			p.anys[i] = ffiAny{typeIndex: C.kTVMFFIBool}
			if v {
				p.anys[i].value = 1
			}
		case float32:
			p.anys[i] = ffiAny{typeIndex: C.kTVMFFIFloat, value: math.Float64bits(float64(v))}
		case float64:
			p.anys[i] = ffiAny{typeIndex: C.kTVMFFIFloat, value: math.Float64bits(v)}
		case string:
			s := append([]byte(v), 0)
			p.pinner.Pin(&s[0])
			p.setPointer(i, C.kTVMFFIRawStr, unsafe.Pointer(&s[0]))
		default:
			iv, ok := toInt64(a)
			if !ok {
				p.free()
				return nil, fmt.Errorf("argument %d has type %T; dsoop passes tensors, integers, floats, bools, strings and nil", i, a)
			}
			p.anys[i] = ffiAny{typeIndex: C.kTVMFFIInt, value: uint64(iv)}
		}
	}
	return p, nil
}

func toInt64(a any) (int64, bool) {
	switch v := a.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint:
		return int64(v), v <= math.MaxInt64
	case uint64:
		return int64(v), v <= math.MaxInt64
	}
	return 0, false
}

// fillDLTensor describes t in d, with its shape and strides in dims; it returns
// what is left of dims.
func fillDLTensor(d *C.DLTensor, t *dlpack.Tensor, dims []C.int64_t, pinner *runtime.Pinner) []C.int64_t {
	if t.Data != nil {
		pinner.Pin(t.Data) // does nothing for memory Go does not own
	}
	d.data = t.Data
	d.device = C.DLDevice{device_type: C.DLDeviceType(t.Device.Type), device_id: C.int32_t(t.Device.ID)}
	d.ndim = C.int32_t(len(t.Shape))
	d.dtype = C.DLDataType{code: C.uint8_t(t.DType.Code), bits: C.uint8_t(t.DType.Bits), lanes: C.uint16_t(t.DType.Lanes)}
	d.byte_offset = C.uint64_t(t.ByteOffset)
	d.shape, dims = putDims(t.Shape, dims)
	d.strides, dims = putDims(t.Strides, dims)
	return dims
}

// putDims copies values to the front of dims and returns where they are (nil for
// none) and what is left of dims.
func putDims(values []int64, dims []C.int64_t) (*C.int64_t, []C.int64_t) {
	if len(values) == 0 {
		return nil, dims
	}
	for j, v := range values {
		dims[j] = C.int64_t(v)
	}
	return &dims[0], dims[len(values):]
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
		return ErrClosed
	}
	C.dsoop_function_retain(&f.ref.fn, (*C.DsoopFunction)(dst))
	return nil
}
