// make bench's whole-model baseline (bench/compare.py model): a model's VM function called from a C loop
// through the dsoop VM path the op's kernel takes, no Python or TensorFlow per call (the input is wrapped
// once). Loaded with ctypes beside the op; only vm_direct_* is exported, so this dsoop never interposes.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsoop/dsoop.h"
#include "dsoop/vm.h"

#define EXPORT __attribute__((visibility("default")))

enum { kMaxDims = 8, kAlignment = 64 };

typedef struct {
  DsoopVMPool* pool;
  int32_t index;
  float* data;  // the input, kAlignment-aligned, owned here
  int64_t shape[kMaxDims];
  DLManagedTensor managed;
  TVMFFIAny arg;  // the input as a Tensor object (one reference, ours)
} VmDirect;

// The Tensor object borrows data, which vm_direct_close frees: nothing to delete.
static void keep(DLManagedTensor* self) { (void)self; }

// Writes "what: kind: message" into out and clears err; returns -1.
static int report(char* out, int out_len, const char* what, DsoopError* err) {
  snprintf(out, (size_t)out_len, "%s: %s: %s", what, err->kind ? err->kind : "Error", err->message ? err->message : "");
  dsoop_error_clear(err);
  return -1;
}

EXPORT void vm_direct_close(VmDirect* vm) {
  if (vm == NULL) return;
  if (vm->arg.v_obj != NULL) dsoop_object_release(vm->arg.v_obj);
  dsoop_vm_pool_destroy(vm->pool);
  free(vm->data);
  free(vm);
}

// Opens the TVM runtime (in a process where the op already opened it RTLD_GLOBAL,
// dlopen gives back the same copies), loads model_lib, makes a CPU pool of one VM
// instance, resolves `function` (which must take one input), and wraps a copy of
// the float32 input of the given shape. NULL on failure, with the reason in err.
EXPORT VmDirect* vm_direct_open(const char* model_lib, const char* function, const float* input,
                                const int64_t* shape, int ndim, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  TVMFFIObjectHandle handle = NULL;
  int64_t arity = 0, n = 1;
  VmDirect* vm = (VmDirect*)calloc(1, sizeof(VmDirect));
  if (vm == NULL || ndim < 0 || ndim > kMaxDims) {
    dsoop_error_set(&e, "ValueError", "out of memory, or input rank %d over %d", ndim, kMaxDims);
    goto fail;
  }
  if (dsoop_runtime_init("libtvm_ffi.so", "libtvm_runtime.so", &e) != 0) goto fail;
  if (dsoop_module_load(model_lib, &handle, &e) != 0) goto fail;
  const int made = dsoop_vm_pool_create(handle, kDLCPU, 0, 1, &vm->pool, &e);
  dsoop_object_release(handle);  // the pool holds its own reference
  if (made != 0) goto fail;
  const int found = dsoop_vm_pool_function(vm->pool, function, &vm->index, &arity, &e);
  if (found < 0) goto fail;
  if (found == 0 || arity != 1) {
    dsoop_error_set(&e, "ValueError", "no VM function %s taking 1 input (found %d, arity %lld)", function, found,
                    (long long)arity);
    goto fail;
  }
  for (int d = 0; d < ndim; ++d) n *= (vm->shape[d] = shape[d]);
  const size_t bytes = ((size_t)n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  if ((vm->data = (float*)aligned_alloc(kAlignment, bytes > 0 ? bytes : kAlignment)) == NULL) {
    dsoop_error_set(&e, "MemoryError", "out of memory for the input");
    goto fail;
  }
  memcpy(vm->data, input, (size_t)n * sizeof(float));
  vm->managed.dl_tensor = (DLTensor){.data = vm->data, .device = {kDLCPU, 0}, .ndim = ndim,
                                     .dtype = {kDLFloat, 32, 1}, .shape = vm->shape};
  vm->managed.deleter = keep;
  if (dsoop_tensor_from_dlpack(&vm->managed, &handle, &e) != 0) goto fail;
  vm->arg.type_index = kTVMFFITensor;
  vm->arg.v_obj = (TVMFFIObject*)handle;
  return vm;
fail:
  report(err, err_len, model_lib, &e);
  vm_direct_close(vm);
  return NULL;
}

// Copies a call's single float32 CPU output into output (output_len elements).
static int copy_output(TVMFFIAny* result, float* output, int64_t output_len, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  TVMFFIObjectHandle tensor = NULL;
  DLManagedTensor* view = NULL;
  const int count = dsoop_result_tensors(result, &tensor, 1, &e);
  if (count > 1) dsoop_object_release(tensor);
  if (count != 1 && count >= 0) dsoop_error_set(&e, "ValueError", "the function returned %d tensors, not 1", count);
  if (count != 1) return report(err, err_len, "output", &e);
  const int exported = dsoop_tensor_to_dlpack(tensor, &view, &e);
  dsoop_object_release(tensor);
  if (exported != 0) return report(err, err_len, "output", &e);
  const DLTensor* t = &view->dl_tensor;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  const int ok = t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->device.device_type == kDLCPU && n == output_len;
  if (ok) memcpy(output, (const char*)t->data + t->byte_offset, (size_t)n * sizeof(float));
  else snprintf(err, (size_t)err_len, "the output is not %lld float32 on the CPU", (long long)output_len);
  view->deleter(view);
  return ok ? 0 : -1;
}

// Seconds per call over `calls` calls (clock_gettime, CLOCK_MONOTONIC), each
// call's result released at once as the op's kernel releases it when TF is done
// with the output; negative on failure. With output, the last call's output is
// copied there (output_len float32) after the clock stops.
EXPORT double vm_direct_time(VmDirect* vm, int calls, float* output, int64_t output_len, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  TVMFFIAny result;
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int c = 0; c < calls; ++c) {
    if (dsoop_vm_call(vm->pool, vm->index, &vm->arg, 1, NULL, &result, &e) != 0) return report(err, err_len, "call", &e);
    if (output == NULL || c + 1 < calls) dsoop_any_release(&result);
  }
  clock_gettime(CLOCK_MONOTONIC, &end);
  const double seconds = ((end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) * 1e-9) / (calls > 0 ? calls : 1);
  if (output == NULL || calls < 1) return seconds;
  const int copied = copy_output(&result, output, output_len, err, err_len);
  dsoop_any_release(&result);
  return copied == 0 ? seconds : -1.0;
}
