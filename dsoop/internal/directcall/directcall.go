// Package directcall calls a dsoop function from a C loop, with no Go per call:
// the baseline that the Go binding's per-call cost is measured against.
package directcall

/*
#cgo CFLAGS: -I${SRCDIR}/../../.. -I${SRCDIR}/../../../third_party/tvm-ffi/include
#include <stdlib.h>
#include "dsoop/dsoop.h"

// Calls fn(x, y) iters times on two float32 vectors of n elements in C memory.
static int call_loop(const DsoopFunction* fn, int64_t n, int64_t iters, DsoopError* err) {
  float* x = (float*)calloc(n > 0 ? n : 1, sizeof(float));
  float* y = (float*)calloc(n > 0 ? n : 1, sizeof(float));
  int64_t shape[1] = {n};
  DLTensor tensors[2];
  TVMFFIAny args[2];
  for (int i = 0; i < 2; ++i) {
    tensors[i].data = i == 0 ? (void*)x : (void*)y;
    tensors[i].device.device_type = kDLCPU;
    tensors[i].device.device_id = 0;
    tensors[i].ndim = 1;
    tensors[i].dtype.code = kDLFloat;
    tensors[i].dtype.bits = 32;
    tensors[i].dtype.lanes = 1;
    tensors[i].shape = shape;
    tensors[i].strides = NULL;
    tensors[i].byte_offset = 0;
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_ptr = &tensors[i];
  }
  int rc = 0;
  for (int64_t k = 0; k < iters && rc == 0; ++k) rc = dsoop_function_call(fn, args, 2, err);
  free(x);
  free(y);
  return rc;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

// Loop calls f(x, y) iters times from C, on float32 vectors of n elements.
func Loop(f *dsoop.Func, n, iters int64) error {
	var fn C.DsoopFunction
	if err := native.RetainFunc(f, unsafe.Pointer(&fn)); err != nil {
		return err
	}
	defer C.dsoop_object_release(fn.handle)
	var cerr C.DsoopError
	if C.call_loop(&fn, C.int64_t(n), C.int64_t(iters), &cerr) != 0 {
		defer C.dsoop_error_clear(&cerr)
		return fmt.Errorf("directcall: %s: %s", C.GoString(cerr.kind), C.GoString(cerr.message))
	}
	return nil
}
