// stream_harness: the GPU path of TVMDSOOp proved without TensorFlow (no GPU build
// of TF is at hand). It drives the launch code the TF GPU kernel uses,
// dsoop_function_call_on_stream, on device buffers and a NON-BLOCKING stream (as
// TF creates its streams), with a tvm-ffi CUDA library (cuda_funcs.so):
//
//   1. values: add_one on the stream gives x + 1;
//   2. ordering: a long kernel (slow_fill, ~0.2 s) queued first, our call next, a
//      device-to-host copy last, with no synchronisation between them: our call
//      must see the long kernel's output, and must return before it finishes;
//   3. the hazard the old op had, shown for contrast: the same sequence with TVM
//      on CUDA's legacy default stream reads the buffer before it is written.
//
//   stream_harness LIBTVM_FFI.so CUDA_FUNCS.so
//
// The CUDA driver is loaded at run time (no toolkit needed to build). Exit status
// 0 when 1 and 2 hold, 1 when they do not, 2 when there is no GPU.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsoop/dsoop.h"

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*stream_create)(CUstream*, unsigned);
  CUresult (*stream_query)(CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*ctx_synchronize)(void);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*memset_d32)(CUdeviceptr, unsigned, size_t);
  CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*device_get_attribute)(int*, int, CUdevice);
} cu;

enum { kNonBlocking = 1, kNotReady = 600, kClockRateAttribute = 13 };
enum { kN = 1 << 20 };

static int check(CUresult rc, const char* what) {
  if (rc != 0) fprintf(stderr, "stream_harness: %s: CUDA error %d\n", what, rc);
  return rc == 0;
}

static int load_driver(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) return 0;
#define SYM(field, name) *(void**)(&cu.field) = dlsym(lib, name)
  SYM(init, "cuInit");
  SYM(device_get, "cuDeviceGet");
  SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  SYM(ctx_set_current, "cuCtxSetCurrent");
  SYM(stream_create, "cuStreamCreate");
  SYM(stream_query, "cuStreamQuery");
  SYM(stream_synchronize, "cuStreamSynchronize");
  SYM(ctx_synchronize, "cuCtxSynchronize");
  SYM(mem_alloc, "cuMemAlloc_v2");
  SYM(memset_d32, "cuMemsetD32_v2");
  SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  SYM(device_get_attribute, "cuDeviceGetAttribute");
#undef SYM
  return cu.init != NULL && cu.memcpy_dtoh_async != NULL;
}

static void set_tensor(DLTensor* t, TVMFFIAny* arg, CUdeviceptr data, int64_t* shape) {
  memset(t, 0, sizeof(*t));
  t->data = (void*)(uintptr_t)data;
  t->device.device_type = kDLCUDA;
  t->device.device_id = 0;
  t->ndim = 1;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = shape;
  arg->type_index = kTVMFFIDLTensorPtr;
  arg->zero_padding = 0;
  arg->v_ptr = t;
}

// Queues slow_fill(a, 41) then add_one(a -> b) on `stream` through dsoop (TVM's
// current stream set to it), then copies b to host on `copy_stream`, and waits.
// *returned_early tells whether our calls returned while the long kernel ran.
static int run_sequence(const DsoopFunction* slow_fill, const DsoopFunction* add_one,
                        CUstream stream, CUstream copy_stream, CUdeviceptr a, CUdeviceptr b,
                        long long cycles, float* host, int* returned_early) {
  int64_t shape[1] = {kN};
  DLTensor ta, tb;
  TVMFFIAny fill_args[3], add_args[2];
  DsoopError err = {NULL, NULL};
  if (!check(cu.memset_d32(a, 0, kN), "memset a") || !check(cu.memset_d32(b, 0, kN), "memset b") ||
      !check(cu.ctx_synchronize(), "synchronize")) {
    return 0;
  }
  set_tensor(&ta, &fill_args[0], a, shape);
  fill_args[1].type_index = kTVMFFIFloat;
  fill_args[1].zero_padding = 0;
  fill_args[1].v_float64 = 41.0;
  fill_args[2].type_index = kTVMFFIInt;
  fill_args[2].zero_padding = 0;
  fill_args[2].v_int64 = cycles;
  set_tensor(&ta, &add_args[0], a, shape);
  set_tensor(&tb, &add_args[1], b, shape);
  if (dsoop_function_call_on_stream(slow_fill, fill_args, 3, kDLCUDA, 0, copy_stream, &err) != 0 ||
      dsoop_function_call_on_stream(add_one, add_args, 2, kDLCUDA, 0, stream, &err) != 0) {
    fprintf(stderr, "stream_harness: %s: %s\n", err.kind, err.message);
    dsoop_error_clear(&err);
    return 0;
  }
  *returned_early = cu.stream_query(copy_stream) == kNotReady;
  if (!check(cu.memcpy_dtoh_async(host, b, kN * sizeof(float), copy_stream), "copy out") ||
      !check(cu.ctx_synchronize(), "synchronize")) {
    return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: stream_harness LIBTVM_FFI.so CUDA_FUNCS.so\n");
    return 1;
  }
  CUdevice device;
  CUcontext context;
  if (!load_driver() || cu.init(0) != 0 || cu.device_get(&device, 0) != 0) {
    fprintf(stderr, "stream_harness: no CUDA GPU (libcuda.so.1 and a device are needed)\n");
    return 2;
  }
  if (!check(cu.primary_ctx_retain(&context, device), "context") ||
      !check(cu.ctx_set_current(context), "context")) {
    return 1;
  }
  DsoopError err = {NULL, NULL};
  TVMFFIObjectHandle module = NULL;
  DsoopFunction add_one, slow_fill;
  if (dsoop_runtime_init(argv[1], "", &err) != 0 || dsoop_module_load(argv[2], &module, &err) != 0 ||
      dsoop_module_get_function(module, "add_one", &add_one, &err) != 1 ||
      dsoop_module_get_function(module, "slow_fill", &slow_fill, &err) != 1) {
    fprintf(stderr, "stream_harness: loading %s: %s: %s\n", argv[2], err.kind ? err.kind : "",
            err.message ? err.message : "function missing");
    return 1;
  }

  CUstream stream;
  CUdeviceptr a, b;
  int clock_khz = 0;
  float* host = (float*)malloc(kN * sizeof(float));
  if (!check(cu.stream_create(&stream, kNonBlocking), "stream") ||
      !check(cu.mem_alloc(&a, kN * sizeof(float)), "alloc") ||
      !check(cu.mem_alloc(&b, kN * sizeof(float)), "alloc") ||
      !check(cu.device_get_attribute(&clock_khz, kClockRateAttribute, device), "clock rate")) {
    return 1;
  }
  const long long cycles = (long long)clock_khz * 200;  // ~0.2 s at the SM clock

  // 1 and 2: everything on TF-like non-blocking stream, no synchronisation between.
  int early = 0;
  if (!run_sequence(&slow_fill, &add_one, stream, stream, a, b, cycles, host, &early)) return 1;
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += host[i] != 42.0f;
  printf("same stream: %d of %d values wrong (want 0); our calls returned %s the long kernel ended\n",
         wrong, kN, early ? "before" : "AFTER");

  // 3: TVM on the legacy default stream (NULL), as the old op ran it.
  int control_early = 0;
  if (!run_sequence(&slow_fill, &add_one, NULL, stream, a, b, cycles, host, &control_early)) return 1;
  int stale = 0;
  for (int i = 0; i < kN; ++i) stale += host[i] == 1.0f;
  printf("legacy default stream (contrast): %d of %d values computed from the unwritten buffer\n",
         stale, kN);

  free(host);
  return wrong == 0 && early ? 0 : 1;
}
