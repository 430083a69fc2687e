package tfbridge

// #cgo LDFLAGS: -ltensorflow
// #include <stdint.h>
// #include "tensorflow/c/tf_tensor.h"
//
// // An empty tensor (shape [0]) of dtype, for a released Tensor to hold.
// static TF_Tensor* tfbridge_empty_tensor(TF_DataType dtype) {
//   const int64_t dims[1] = {0};
//   return TF_AllocateTensor(dtype, dims, 1, 0);
// }
import "C"

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"
)

// graftTensor is the layout of graft's Tensor at the version go.mod pins
// (v0.10.0): the C tensor it owns, then its shape. graft frees the C tensor only
// in a finalizer and exports no way to do it sooner, so Release reaches it
// through this layout, once graftLayoutKnown has checked it field by field.
type graftTensor struct {
	c     *C.TF_Tensor
	shape []int64
}

// graftLayoutKnown reports whether graft's Tensor is laid out as graftTensor: a
// module that requires a newer graft may get another layout.
var graftLayoutKnown = sync.OnceValue(func() bool {
	want, got := reflect.TypeFor[graftTensor](), reflect.TypeFor[tf.Tensor]()
	if got.Size() != want.Size() || got.NumField() != want.NumField() {
		return false
	}
	// The C type is graft's own cgo type, so it is matched by name.
	c, wantC := got.Field(0), want.Field(0)
	shape, wantShape := got.Field(1), want.Field(1)
	return c.Name == wantC.Name && c.Offset == wantC.Offset && c.Type.Kind() == reflect.Pointer &&
		c.Type.Elem().Name() == wantC.Type.Elem().Name() &&
		shape.Name == wantShape.Name && shape.Offset == wantShape.Offset && shape.Type == wantShape.Type
})

// Release drops each tensor's hold on its C memory now, as its finalizer would
// once Go's collector found it unreachable, and leaves the tensor empty: shape
// [0], its type kept (a scalar's Value becomes an empty slice). The memory is
// freed unless TF still holds it elsewhere (a constant of the graph, a fed
// input). Call it on a Session.Run's outputs once they have been read, and only
// when nothing else uses them: not while another goroutine reads, feeds or
// releases the same tensor.
//
// Go's collector does not see the C memory a tensor holds; a server that writes
// its responses out allocates little Go memory and so collects rarely, and every
// output left to it is fresh memory for the op to fault in (docs/go.md).
//
// Every tensor is released that can be; the error names those that could not.
// A nil tensor is skipped.
func Release(tensors ...*tf.Tensor) error {
	if !graftLayoutKnown() {
		return errors.New("tfbridge: Release: graft's Tensor is not laid out as graft v0.10.0's, which tfbridge knows")
	}
	var errs []error
	for i, t := range tensors {
		if t == nil {
			continue
		}
		if err := release((*graftTensor)(unsafe.Pointer(t))); err != nil {
			errs = append(errs, fmt.Errorf("tfbridge: Release: tensor %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// release swaps t's C tensor for an empty one of its type and deletes the old
// one; t's finalizer deletes whichever it holds when it runs.
func release(t *graftTensor) error {
	if t.c == nil {
		return errors.New("not a tensor made by graft (it holds no C tensor)")
	}
	empty := C.tfbridge_empty_tensor(C.TF_TensorType(t.c))
	if empty == nil {
		return errors.New("cannot allocate an empty tensor")
	}
	C.TF_DeleteTensor(t.c)
	t.c, t.shape = empty, []int64{0}
	return nil
}
