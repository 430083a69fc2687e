package dsoop

/*
#include <stdlib.h>
#include "goapi.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// frame is one call's arguments as C reads them: the TVMFFIAny array, the
// DLTensors and their shapes and strides, in one C block. Being C memory, C may
// follow its pointers with nothing pinned; the only Go pointers a call needs
// are tensor data, and the first few of those travel as arguments of the cgo call
// (direct), which keeps them valid for the call. Frames are pooled, so a call
// allocates nothing in the common case.
//
// Go writes the block only through pointer-free types (ffiAny, dlTensor): a store
// of a pointer type runs Go's write barrier on the slot's old contents, which in
// a reused C block are stale pointers from an earlier call, or malloc garbage.
type frame struct {
	block   *cBlock
	anys    []ffiAny // views of block
	tensors []dlTensor
	dims    []C.int64_t
	direct  []unsafe.Pointer // data of the first kDirectData tensors
	strings []*C.char        // string arguments, copied to C; freed after the call
	pinner  runtime.Pinner   // Go data of tensors past the direct ones
	err     C.DsoopError     // here, not on the stack, which cgo would move to the heap
}

// cBlock owns a frame's C memory; a cleanup frees it when the pool drops the
// frame. It is apart from frame so that the cleanup does not keep frame alive.
type cBlock struct {
	ptr  unsafe.Pointer
	size uintptr
}

func (b *cBlock) free() { C.free(b.ptr) }

var frames = sync.Pool{New: func() any {
	fr := &frame{block: &cBlock{}, direct: make([]unsafe.Pointer, 0, C.kDirectData)}
	runtime.AddCleanup(fr, (*cBlock).free, fr.block)
	return fr
}}

// release readies the frame for its next call and returns it to the pool.
func (fr *frame) release() {
	fr.pinner.Unpin()
	for _, s := range fr.strings {
		C.free(unsafe.Pointer(s))
	}
	clear(fr.direct)
	fr.strings, fr.direct = fr.strings[:0], fr.direct[:0]
	frames.Put(fr)
}

// reserve lays out room for n arguments, t tensors and d shape and stride values,
// growing the C block when it is too small.
func (fr *frame) reserve(n, t, d int) error {
	anyBytes := uintptr(n) * unsafe.Sizeof(ffiAny{})
	tensorBytes := uintptr(t) * unsafe.Sizeof(dlTensor{})
	size := anyBytes + tensorBytes + uintptr(d)*C.sizeof_int64_t
	if size > fr.block.size {
		grown := max(size, 2*fr.block.size, 256)
		ptr := C.realloc(fr.block.ptr, C.size_t(grown))
		if ptr == nil {
			return fmt.Errorf("out of memory for %d bytes of call arguments", grown)
		}
		fr.block.ptr, fr.block.size = ptr, grown
	}
	base := fr.block.ptr
	fr.anys = unsafe.Slice((*ffiAny)(base), n)
	fr.tensors = unsafe.Slice((*dlTensor)(unsafe.Add(base, anyBytes)), t)
	fr.dims = unsafe.Slice((*C.int64_t)(unsafe.Add(base, anyBytes+tensorBytes)), d)
	return nil
}

// call calls fn on the packed arguments.
func (fr *frame) call(fn C.DsoopFunction, mode callMode) error {
	var args *C.TVMFFIAny
	if len(fr.anys) > 0 {
		args = (*C.TVMFFIAny)(unsafe.Pointer(&fr.anys[0]))
	}
	var tensors *C.DLTensor
	if len(fr.tensors) > 0 {
		tensors = (*C.DLTensor)(unsafe.Pointer(&fr.tensors[0]))
	}
	var d [C.kDirectData]unsafe.Pointer
	copy(d[:], fr.direct)
	cMode := C.int(C.kGoCallDiscard)
	switch {
	case mode.value != nil:
		cMode = C.kGoCallValue
	case mode.onStream:
		cMode = C.kGoCallOnStream
	}
	if C.dsoop_go_call(fn, args, C.int32_t(len(fr.anys)), tensors, C.int32_t(len(fr.tensors)),
		C.int32_t(len(fr.direct)), d[0], d[1], d[2], d[3], cMode, C.int32_t(mode.device.Type), C.int32_t(mode.device.ID),
		mode.stream, mode.value, &fr.err) != 0 {
		// A copy: cgo checks a pointer into the frame as the whole frame, Go
		// pointers included, unless it is written &fr.err at the call.
		cerr := fr.err
		fr.err = C.DsoopError{}
		return takeError(&cerr)
	}
	return nil
}

// pack describes args in the frame.
func (fr *frame) pack(args []any) error {
	numTensors, numDims := 0, 0
	for i, a := range args {
		var t *dlpack.Tensor
		switch v := a.(type) {
		case *dlpack.Tensor:
			t = v
		case dlpack.Tensor:
			t = &v
		}
		if t == nil {
			continue
		}
		if err := checkStrides(i, t); err != nil {
			return err
		}
		numTensors++
		numDims += len(t.Shape) + len(t.Strides)
	}
	if err := fr.reserve(len(args), numTensors, numDims); err != nil {
		return err
	}
	tensors, dims := fr.tensors, fr.dims
	tensor := func(i int, t *dlpack.Tensor) {
		d := &tensors[0]
		tensors = tensors[1:]
		dims = fr.describe(d, t, dims)
		fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIDLTensorPtr, value: uint64(uintptr(unsafe.Pointer(d)))}
	}
	for i, a := range args {
		switch v := a.(type) {
		case *dlpack.Tensor:
			if v == nil {
				return fmt.Errorf("argument %d is a nil tensor", i)
			}
			tensor(i, v)
		case dlpack.Tensor:
			tensor(i, &v)
		case nil:
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFINone}
		case bool:
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIBool}
			if v {
				fr.anys[i].value = 1
			}
		case float32:
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIFloat, value: math.Float64bits(float64(v))}
		case float64:
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIFloat, value: math.Float64bits(v)}
		case string:
			s := C.CString(v)
			fr.strings = append(fr.strings, s)
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIRawStr, value: uint64(uintptr(unsafe.Pointer(s)))}
		default:
			iv, ok := toInt64(a)
			if !ok {
				return fmt.Errorf("argument %d has type %T; dsoop passes tensors, integers, floats, bools, strings and nil", i, a)
			}
			fr.anys[i] = ffiAny{typeIndex: C.kTVMFFIInt, value: uint64(iv)}
		}
	}
	return nil
}

// describe fills d from t, with its shape and strides in dims, and returns what
// is left of dims. The data of the first tensors is left for C to fill from the
// call's direct arguments; the rest, in Go memory, is pinned.
func (fr *frame) describe(d *dlTensor, t *dlpack.Tensor, dims []C.int64_t) []C.int64_t {
	d.data = 0
	if len(fr.direct) < cap(fr.direct) {
		fr.direct = append(fr.direct, t.Data)
	} else if t.Data != nil {
		fr.pinner.Pin(t.Data) // does nothing for memory Go does not own
		d.data = uintptr(t.Data)
	}
	return describeTensor(d, t, dims)
}

// checkStrides refuses argument i when its strides do not match its rank: TVM
// reads ndim strides, and fewer would be read past this tensor's own.
func checkStrides(i int, t *dlpack.Tensor) error {
	if len(t.Strides) != 0 && len(t.Strides) != len(t.Shape) {
		return fmt.Errorf("argument %d has %d strides for %d dimensions", i, len(t.Strides), len(t.Shape))
	}
	return nil
}

// describeTensor fills all of d but its data from t, with t's shape and strides
// in dims, and returns what is left of dims.
func describeTensor(d *dlTensor, t *dlpack.Tensor, dims []C.int64_t) []C.int64_t {
	d.device = C.DLDevice{device_type: C.DLDeviceType(t.Device.Type), device_id: C.int32_t(t.Device.ID)}
	d.ndim = C.int32_t(len(t.Shape))
	d.dtype = C.DLDataType{code: C.uint8_t(t.DType.Code), bits: C.uint8_t(t.DType.Bits), lanes: C.uint16_t(t.DType.Lanes)}
	d.shape, dims = putDims(t.Shape, dims)
	d.strides, dims = putDims(t.Strides, dims)
	d.byteOffset = C.uint64_t(t.ByteOffset)
	return dims
}

// putDims copies values to the front of dims and returns their address (0 for
// none) and what is left of dims.
func putDims(values []int64, dims []C.int64_t) (uintptr, []C.int64_t) {
	if len(values) == 0 {
		return 0, dims
	}
	for j, v := range values {
		dims[j] = C.int64_t(v)
	}
	return uintptr(unsafe.Pointer(&dims[0])), dims[len(values):]
}

// dlTensor mirrors DLTensor (dlpack.h) with its pointers as uintptr, so that Go
// writes it into C memory with no write barrier (see frame).
type dlTensor struct {
	data       uintptr
	device     C.DLDevice
	ndim       C.int32_t
	dtype      C.DLDataType
	shape      uintptr
	strides    uintptr
	byteOffset C.uint64_t
}

// Build-time checks that dlTensor matches DLTensor field by field, as for ffiAny.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(dlTensor{})-uintptr(C.sizeof_DLTensor)]
	_ = [1]struct{}{}[unsafe.Offsetof(dlTensor{}.shape)-unsafe.Offsetof(C.DLTensor{}.shape)]
	_ = [1]struct{}{}[unsafe.Offsetof(dlTensor{}.strides)-unsafe.Offsetof(C.DLTensor{}.strides)]
	_ = [1]struct{}{}[unsafe.Offsetof(dlTensor{}.byteOffset)-unsafe.Offsetof(C.DLTensor{}.byte_offset)]
	_ = [1]struct{}{}[unsafe.Offsetof(dlTensor{}.dtype)-unsafe.Offsetof(C.DLTensor{}.dtype)]
)

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
