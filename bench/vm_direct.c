// vm_direct.c: the baseline of make bench's whole-model comparison
// (bench/compare.py model): a model's VM function called from a C loop, with no
// Python and no TensorFlow per call, through the same dsoop VM path the op's
// kernel takes (dsoop/vm.c: a pool of VM instances, the input lent as a Tensor
// object, the returned tensors released). The bench process loads this library
// with ctypes, beside TensorFlow and the op, and times it in the same rounds as
// the op: what the op adds to a model call is the difference.
//
// The input is copied once into memory this library owns and wrapped once as a
// Tensor object, so a timed call is dsoop_vm_call + dsoop_any_release and
// nothing else. Only the vm_direct_* functions are exported (the build hides
// the rest), so this copy of dsoop never interposes on the op library's.
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

static void report(char* out, int out_len, const char* what, DsoopError* err) {
  if (out != NULL && out_len > 0) {
    snprintf(out, (size_t)out_len, "%s: %s: %s", what, err->kind ? err->kind : "Error",
             err->message ? err->message : "");
  }
  dsoop_error_clear(err);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

EXPORT void vm_direct_close(VmDirect* vm);

// Opens the TVM runtime (ffi_lib, runtime_lib: in a process where the op already
// opened them RTLD_GLOBAL, dlopen gives back the same copies), loads model_lib,
// makes a CPU pool of one VM instance, resolves `function` (which must take one
// input), and wraps a copy of the float32 input of the given shape. NULL on
// failure, with the reason in err.
EXPORT VmDirect* vm_direct_open(const char* ffi_lib, const char* runtime_lib, const char* model_lib,
                                const char* function, const float* input, const int64_t* shape,
                                int ndim, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  if (ndim < 0 || ndim > kMaxDims) {
    snprintf(err, (size_t)err_len, "input rank %d: at most %d", ndim, kMaxDims);
    return NULL;
  }
  if (dsoop_runtime_init(ffi_lib, runtime_lib, &e) != 0) {
    report(err, err_len, "TVM runtime", &e);
    return NULL;
  }
  VmDirect* vm = (VmDirect*)calloc(1, sizeof(VmDirect));
  if (vm == NULL) {
    snprintf(err, (size_t)err_len, "out of memory");
    return NULL;
  }
  TVMFFIObjectHandle module = NULL;
  if (dsoop_module_load(model_lib, &module, &e) != 0) {
    report(err, err_len, model_lib, &e);
    vm_direct_close(vm);
    return NULL;
  }
  const int made = dsoop_vm_pool_create(module, kDLCPU, 0, 1, &vm->pool, &e);
  dsoop_object_release(module);  // the pool holds its own reference
  if (made != 0) {
    report(err, err_len, model_lib, &e);
    vm_direct_close(vm);
    return NULL;
  }
  int64_t arity = 0;
  const int found = dsoop_vm_pool_function(vm->pool, function, &vm->index, &arity, &e);
  if (found != 1 || arity != 1) {
    if (found == 1) snprintf(err, (size_t)err_len, "%s takes %lld inputs, not 1", function, (long long)arity);
    else if (found == 0) snprintf(err, (size_t)err_len, "%s has no VM function %s", model_lib, function);
    else report(err, err_len, function, &e);
    vm_direct_close(vm);
    return NULL;
  }
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    vm->shape[d] = shape[d];
    n *= shape[d];
  }
  const size_t bytes = ((size_t)n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  vm->data = (float*)aligned_alloc(kAlignment, bytes > 0 ? bytes : kAlignment);
  if (vm->data == NULL) {
    snprintf(err, (size_t)err_len, "out of memory for the input");
    vm_direct_close(vm);
    return NULL;
  }
  memcpy(vm->data, input, (size_t)n * sizeof(float));
  DLTensor* t = &vm->managed.dl_tensor;
  t->data = vm->data;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = ndim;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = vm->shape;
  vm->managed.deleter = keep;
  TVMFFIObjectHandle handle = NULL;
  if (dsoop_tensor_from_dlpack(&vm->managed, &handle, &e) != 0) {
    report(err, err_len, "input", &e);
    vm_direct_close(vm);
    return NULL;
  }
  vm->arg.type_index = kTVMFFITensor;
  vm->arg.zero_padding = 0;
  vm->arg.v_obj = (TVMFFIObject*)handle;
  return vm;
}

// Calls the function once and copies its (single, float32) output into output,
// at most output_len elements. Returns the output's element count, -1 on failure.
EXPORT int64_t vm_direct_output(VmDirect* vm, float* output, int64_t output_len, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  TVMFFIAny result;
  if (dsoop_vm_call(vm->pool, vm->index, &vm->arg, 1, NULL, &result, &e) != 0) {
    report(err, err_len, "call", &e);
    return -1;
  }
  TVMFFIObjectHandle tensor = NULL;
  const int count = dsoop_result_tensors(&result, &tensor, 1, &e);
  dsoop_any_release(&result);
  if (count != 1) {
    if (count < 0) report(err, err_len, "output", &e);
    else snprintf(err, (size_t)err_len, "the function returned %d tensors, not 1", count);
    if (count > 1) dsoop_object_release(tensor);
    return -1;
  }
  DLManagedTensor* view = NULL;
  const int exported = dsoop_tensor_to_dlpack(tensor, &view, &e);
  dsoop_object_release(tensor);
  if (exported != 0) {
    report(err, err_len, "output", &e);
    return -1;
  }
  const DLTensor* t = &view->dl_tensor;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->device.device_type != kDLCPU) {
    snprintf(err, (size_t)err_len, "the output is not float32 on the CPU");
    n = -1;
  } else {
    memcpy(output, (const char*)t->data + t->byte_offset, (size_t)(n < output_len ? n : output_len) * sizeof(float));
  }
  view->deleter(view);
  return n;
}

// Seconds per call over `calls` calls (clock_gettime, CLOCK_MONOTONIC), each
// call's result released at once as the op's kernel releases it when TF is
// done with the output; negative on failure.
EXPORT double vm_direct_time(VmDirect* vm, int calls, char* err, int err_len) {
  DsoopError e = {NULL, NULL};
  TVMFFIAny result;
  const double start = now_seconds();
  for (int c = 0; c < calls; ++c) {
    if (dsoop_vm_call(vm->pool, vm->index, &vm->arg, 1, NULL, &result, &e) != 0) {
      report(err, err_len, "call", &e);
      return -1.0;
    }
    dsoop_any_release(&result);
  }
  return (now_seconds() - start) / (calls > 0 ? calls : 1);
}

EXPORT void vm_direct_close(VmDirect* vm) {
  if (vm == NULL) return;
  if (vm->arg.v_obj != NULL) dsoop_object_release(vm->arg.v_obj);
  dsoop_vm_pool_destroy(vm->pool);
  free(vm->data);
  free(vm);
}
