// directcall.c: see directcall.h.
#include "directcall.h"

#include <stdlib.h>

int directcall_loop(const DsoopFunction* fn, int64_t n, int64_t iters, DsoopError* err) {
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
