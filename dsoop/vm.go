package dsoop

/*
#include <stdlib.h>
#include "goapi.h"
#include "vm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// IsVM reports whether the library holds a whole model: a Relax VM executable
// (tvm.compile of Relax functions, then export_library). Its functions are called
// through VMFunc, and return their outputs.
func (m *Module) IsVM() bool { return m.entry.isVM }

// VMFunc is a function of a whole model (see Module.IsModel) on one device. Calls
// from many goroutines run at once, each on a VM instance of its own from the
// module's pool for the device. Close it when done; a finaliser releases it
// otherwise.
type VMFunc struct {
	name, path string
	arity      int
	device     dlpack.Device
	ref        *vmFuncRef
}

// vmFuncRef owns the VMFunc's reference to its pool (see funcRef).
type vmFuncRef struct {
	mu     sync.RWMutex // Close waits for calls in flight
	pool   *vmPool
	index  C.int32_t
	closed bool
}

func (r *vmFuncRef) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.pool.release()
		r.closed = true
	}
}

// VMFunc looks up function name of the module's model, to run on device. The
// module's VM instances for the device are made at the first lookup for it.
func (m *Module) VMFunc(name string, device dlpack.Device) (*VMFunc, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("dsoop: library %s: bad function name %q", m.entry.path, name)
	}
	if !m.IsModel() {
		return nil, fmt.Errorf("dsoop: library %s holds no whole model: call its functions with Func", m.entry.path)
	}
	if err := checkModelDevice(m.entry.sealed, device); err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, err)
	}
	m.ref.mu.RLock()
	defer m.ref.mu.RUnlock()
	if m.ref.closed {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	p, err := m.pool(device)
	if err != nil {
		return nil, err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var index C.int32_t
	var arity C.int64_t
	var cerr C.DsoopError
	switch C.dsoop_vm_pool_function(p.ptr, cname, &index, &arity, &cerr) {
	case 1:
	case 0:
		p.release()
		available, _ := m.VMFunctions() // best effort: the message lists what there is
		if available == nil {
			available = []string{}
		}
		return nil, &FunctionNotFoundError{Path: m.entry.path, Name: name, Available: available}
	default:
		p.release()
		return nil, fmt.Errorf("dsoop: library %s: function %q: %w", m.entry.path, name, takeError(&cerr))
	}
	f := &VMFunc{name: name, path: m.entry.path, arity: int(arity), device: device,
		ref: &vmFuncRef{pool: p, index: index}}
	runtime.AddCleanup(f, (*vmFuncRef).close, f.ref)
	return f, nil
}

// Name is the function's name in the model.
func (f *VMFunc) Name() string { return f.name }

// Arity is the number of inputs the function takes (parameters included, for
// models whose weights are inputs).
func (f *VMFunc) Arity() int { return f.arity }

// Instances is the number of VM instances the function's pool has made so far:
// each holds the model's registers and intermediate tensors between calls.
func (f *VMFunc) Instances() int { return int(C.dsoop_vm_pool_size(f.ref.pool.ptr)) }

// Outputs are the tensors a model call returned, flattened in order (nested
// tuples depth first). Their memory is TVM's (the VM's allocator, a constant of
// the model, or an input passed through): valid until Close, and not to be
// written. A finaliser closes them otherwise.
type Outputs struct {
	Tensors []*dlpack.Tensor
	ref     *outputsRef
}

// outputsRef owns what Outputs hold: the DLPack views of the returned tensors,
// and the pins on Go inputs, which TVM may return or keep until then.
type outputsRef struct {
	once    sync.Once
	managed []*C.DLManagedTensor
	pinner  runtime.Pinner
}

func (r *outputsRef) close() {
	r.once.Do(func() {
		for _, m := range r.managed {
			C.dsoop_go_delete_managed(m)
		}
		r.managed = nil
		r.pinner.Unpin()
	})
}

// Close releases the outputs; their tensors must not be used after. Idempotent.
func (o *Outputs) Close() error {
	o.ref.close()
	return nil
}

// Call runs the function on CPU tensors (or tensors on the function's device),
// without copying them, and returns its outputs.
func (f *VMFunc) Call(args ...*dlpack.Tensor) (*Outputs, error) {
	return f.CallOn(nil, args...)
}

// CallOn is Call with TVM's current stream for a GPU device set to stream (a
// CUstream) for the call: the model's kernels are queued there, and the call
// may return before they finish.
func (f *VMFunc) CallOn(stream unsafe.Pointer, args ...*dlpack.Tensor) (*Outputs, error) {
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return nil, fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	if len(args) != f.arity {
		return nil, fmt.Errorf("dsoop: %s in %s: %w: takes %d, got %d", f.name, f.path, ErrArity, f.arity, len(args))
	}
	out, err := f.call(stream, args)
	if err != nil {
		return nil, fmt.Errorf("dsoop: %s in %s: %w", f.name, f.path, err)
	}
	return out, nil
}

func (f *VMFunc) call(stream unsafe.Pointer, args []*dlpack.Tensor) (_ *Outputs, err error) {
	ref := &outputsRef{}
	defer func() {
		if err != nil {
			ref.close() // the pins and views taken so far
		}
	}()
	// The arguments as Tensor objects, in C memory.
	anys := unsafe.Slice((*ffiAny)(C.calloc(C.size_t(max(len(args), 1)), C.size_t(unsafe.Sizeof(ffiAny{})))), len(args))
	if len(args) > 0 && anys == nil {
		return nil, errors.New("out of memory for call arguments")
	}
	// The call holds one reference to each argument; TVM takes its own to keep one.
	handles := make([]C.TVMFFIObjectHandle, 0, len(args))
	defer func() {
		for _, h := range handles {
			C.dsoop_object_release(h)
		}
		C.free(unsafe.Pointer(unsafe.SliceData(anys)))
	}()
	fr := frames.Get().(*frame)
	defer fr.release()
	for i, t := range args {
		if t == nil {
			return nil, fmt.Errorf("argument %d is a nil tensor", i)
		}
		if err := checkStrides(i, t); err != nil {
			return nil, err
		}
		if err := fr.reserve(0, 1, len(t.Shape)+len(t.Strides)); err != nil {
			return nil, err
		}
		d := &fr.tensors[0]
		describeTensor(d, t, fr.dims)
		// TVM may keep the tensor past the call (an output may be the input):
		// the pin lasts as long as the outputs.
		if t.Data != nil {
			ref.pinner.Pin(t.Data)
		}
		var handle C.TVMFFIObjectHandle
		if C.dsoop_go_tensor((*C.DLTensor)(unsafe.Pointer(d)), C.uintptr_t(uintptr(t.Data)), &handle, &fr.err) != 0 {
			cerr := fr.err
			fr.err = C.DsoopError{}
			return nil, fmt.Errorf("argument %d: %w", i, takeError(&cerr))
		}
		handles = append(handles, handle)
		anys[i] = ffiAny{typeIndex: C.kTVMFFITensor, value: uint64(uintptr(unsafe.Pointer(handle)))}
	}
	var argp *C.TVMFFIAny
	if len(anys) > 0 {
		argp = (*C.TVMFFIAny)(unsafe.Pointer(&anys[0]))
	}
	var result C.TVMFFIAny
	if C.dsoop_vm_call(f.ref.pool.ptr, f.ref.index, argp, C.int32_t(len(anys)), stream, &result, &fr.err) != 0 {
		cerr := fr.err
		fr.err = C.DsoopError{}
		return nil, takeError(&cerr)
	}
	defer C.dsoop_any_release(&result)
	tensors, err := resultTensors(&result)
	if err != nil {
		return nil, err
	}
	// Each view takes its own reference to its tensor.
	defer func() {
		for _, h := range tensors {
			C.dsoop_object_release(h)
		}
	}()
	for _, handle := range tensors {
		var m *C.DLManagedTensor
		var cerr C.DsoopError
		if C.dsoop_tensor_to_dlpack(handle, &m, &cerr) != 0 {
			return nil, takeError(&cerr)
		}
		ref.managed = append(ref.managed, m)
	}
	out := &Outputs{ref: ref}
	for _, m := range ref.managed {
		out.Tensors = append(out.Tensors, viewOf(&m.dl_tensor))
	}
	runtime.AddCleanup(out, (*outputsRef).close, ref)
	return out, nil
}

// resultTensors flattens a returned value into new references to its tensors.
func resultTensors(result *C.TVMFFIAny) ([]C.TVMFFIObjectHandle, error) {
	handles := make([]C.TVMFFIObjectHandle, 8)
	for {
		buf := (*C.TVMFFIObjectHandle)(C.calloc(C.size_t(len(handles)), C.size_t(unsafe.Sizeof(handles[0]))))
		if buf == nil {
			return nil, errors.New("out of memory for the returned tensors")
		}
		var cerr C.DsoopError
		n := int(C.dsoop_result_tensors(result, buf, C.int(len(handles)), &cerr))
		if n < 0 {
			C.free(unsafe.Pointer(buf))
			return nil, takeError(&cerr)
		}
		got := unsafe.Slice(buf, len(handles))
		if n <= len(handles) {
			out := slices.Clone(got[:n])
			C.free(unsafe.Pointer(buf))
			return out, nil
		}
		// More tensors than room: drop these references and ask again with enough.
		for _, h := range got {
			C.dsoop_object_release(h)
		}
		C.free(unsafe.Pointer(buf))
		handles = make([]C.TVMFFIObjectHandle, n)
	}
}

// viewOf describes a DLTensor in Go; its data stays where it is.
func viewOf(d *C.DLTensor) *dlpack.Tensor {
	t := &dlpack.Tensor{
		Data:       d.data,
		Device:     dlpack.Device{Type: dlpack.DeviceType(d.device.device_type), ID: int32(d.device.device_id)},
		DType:      dlpack.DataType{Code: dlpack.DataTypeCode(d.dtype.code), Bits: uint8(d.dtype.bits), Lanes: uint16(d.dtype.lanes)},
		Shape:      make([]int64, int(d.ndim)),
		ByteOffset: uint64(d.byte_offset),
	}
	if d.ndim > 0 {
		for i, v := range unsafe.Slice((*int64)(unsafe.Pointer(d.shape)), int(d.ndim)) {
			t.Shape[i] = v
		}
		if d.strides != nil {
			t.Strides = slices.Clone(unsafe.Slice((*int64)(unsafe.Pointer(d.strides)), int(d.ndim)))
		}
	}
	return t
}

// Close releases the function. Calls after Close fail; Close is idempotent.
func (f *VMFunc) Close() error {
	f.ref.close()
	return nil
}
