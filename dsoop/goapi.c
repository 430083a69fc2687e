// goapi.c: the C half of dsoop's Go API (see goapi.h).
#include "goapi.h"

#include <stdlib.h>
#include <string.h>

int dsoop_go_call(DsoopFunction fn, const TVMFFIAny* args, int32_t num_args, DLTensor* tensors,
                  int32_t num_tensors, int32_t num_direct, void* d0, void* d1, void* d2, void* d3,
                  int mode, int32_t device_type, int32_t device_id, void* stream,
                  DsoopValue* value, DsoopError* err) {
  void* data[kDirectData] = {d0, d1, d2, d3};
  for (int32_t i = 0; i < num_direct; ++i) tensors[i].data = data[i];
  int rc;
  switch (mode) {
    case kGoCallValue:
      rc = dsoop_function_call_value(&fn, args, num_args, value, err);
      break;
    case kGoCallOnStream:
      rc = dsoop_function_call_on_stream(&fn, args, num_args, device_type, device_id, stream, err);
      break;
    default:
      rc = dsoop_function_call(&fn, args, num_args, err);
  }
  for (int32_t i = 0; i < num_tensors; ++i) tensors[i].data = NULL;
  return rc;
}

// The deleter of the DLManagedTensors dsoop_go_tensor makes: their shape and
// strides live in the same block.
static void free_managed(DLManagedTensor* self) { free(self); }

int dsoop_go_tensor(const DLTensor* d, uintptr_t data, TVMFFIObjectHandle* out, DsoopError* err) {
  const size_t dims = (size_t)d->ndim * (d->strides != NULL ? 2 : 1);
  DLManagedTensor* m = (DLManagedTensor*)malloc(sizeof(DLManagedTensor) + dims * sizeof(int64_t));
  if (m == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for a tensor");
  int64_t* shape = (int64_t*)(m + 1);
  // A 0-dim tensor may come with a NULL shape: memcpy's source must not be NULL
  // even for 0 bytes.
  if (d->ndim > 0) memcpy(shape, d->shape, (size_t)d->ndim * sizeof(int64_t));
  m->dl_tensor = *d;
  m->dl_tensor.data = (void*)data;
  m->dl_tensor.shape = shape;
  if (d->strides != NULL) {
    memcpy(shape + d->ndim, d->strides, (size_t)d->ndim * sizeof(int64_t));
    m->dl_tensor.strides = shape + d->ndim;
  }
  m->manager_ctx = NULL;
  m->deleter = free_managed;
  if (dsoop_tensor_from_dlpack(m, out, err) != 0) {
    free(m);
    return -1;
  }
  return 0;
}

void dsoop_go_delete_managed(DLManagedTensor* m) {
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}
