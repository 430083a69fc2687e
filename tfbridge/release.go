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
	"runtime"
	"unsafe"

	tf "github.com/wamuir/graft/tensorflow"
)

// graftTensor is the layout of graft's Tensor at the version go.mod pins
// (v0.10.0): the C tensor it owns, then its shape. graft frees the C tensor only
// in a finalizer and exports no way to do it sooner, so Release reaches it
// through this layout. Release refuses a Tensor of another size, and checks the
// type and shape it reads against graft's own before freeing anything.
type graftTensor struct {
	c     *C.TF_Tensor
	shape []int64
}

var errLayout = errors.New("graft's Tensor is not laid out as tfbridge expects (go.mod pins graft v0.10.0)")

// Release frees the memory of tensors now, as their finalizers would once Go's
// collector found them unreachable, and leaves each an empty tensor of its type
// (shape [0]), so that a later use reads no freed memory. Call it on a
// Session.Run's outputs once they have been read.
//
// Why: Go's collector does not see the memory a TF tensor holds in C. A server
// whose requests fetch large outputs allocates little Go memory per request and
// so collects rarely: hundreds of outputs wait for their finalizers, and each
// new output is fresh memory that the op writing it must fault in page by page:
// 256 page faults a request for a 512x512 float32 output (docs/serving.md).
func Release(tensors ...*tf.Tensor) error {
	for i, t := range tensors {
		if t == nil {
			continue
		}
		if err := release(t); err != nil {
			return fmt.Errorf("tfbridge: Release: tensor %d: %w", i, err)
		}
	}
	return nil
}

func release(t *tf.Tensor) error {
	if unsafe.Sizeof(*t) != unsafe.Sizeof(graftTensor{}) {
		return errLayout
	}
	g := (*graftTensor)(unsafe.Pointer(t))
	if g.c == nil || !sameShape(g.c, t.Shape()) || tf.DataType(C.TF_TensorType(g.c)) != t.DataType() {
		return errLayout
	}
	empty := C.tfbridge_empty_tensor(C.TF_TensorType(g.c))
	if empty == nil {
		return errors.New("cannot allocate an empty tensor")
	}
	// t's finalizer deletes whatever C tensor t holds when t goes: from now on,
	// the empty one.
	C.TF_DeleteTensor(g.c)
	g.c, g.shape = empty, []int64{0}
	runtime.KeepAlive(t)
	return nil
}

// sameShape reports whether the C tensor c has the dimensions shape.
func sameShape(c *C.TF_Tensor, shape []int64) bool {
	if int(C.TF_NumDims(c)) != len(shape) {
		return false
	}
	for i, d := range shape {
		if int64(C.TF_Dim(c, C.int(i))) != d {
			return false
		}
	}
	return true
}
