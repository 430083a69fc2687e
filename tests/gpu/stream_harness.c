// stream_harness: the GPU path of TVMDSOOp proved without TensorFlow (no GPU build
// of TF is at hand). It drives the launch code the TF GPU kernel uses,
// dsoop_function_call_on_stream, on device buffers and a NON-BLOCKING stream (as
// TF creates its streams), with TVM's own CUDA code: add_one compiled by apache-tvm
// (TVM's kernel and TVM's launching host code, built by nvcc: tvm_add_one.so),
// and a long-running kernel in a tvm-ffi library (slow_fill.so). It checks
//
//   1. values and ordering: slow_fill (0.2 s, then writes 41) queued first, TVM's
//      add_one next, a device-to-host copy last, with no synchronisation between
//      them: every value must be 42, and our calls must have returned while the
//      long kernel still ran (no hidden synchronisation);
//   2. the hazard the old op had, shown for contrast: the same sequence with TVM
//      on CUDA's legacy default stream reads the buffer before it is written.
//
//   stream_harness LIBTVM_FFI.so SLOW_FILL.so TVM_ADD_ONE.so
//
// The CUDA driver is loaded at run time (no toolkit needed to build). Exit status
// 0 when 1 holds, 1 when it does not, 2 when there is no GPU (no driver, or no
// device), 3 when the driver is older than CUDA 13, which the libraries need.
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
  CUresult (*driver_get_version)(int*);
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
} cu;

enum { kNonBlocking = 1, kNoDevice = 100, kNotReady = 600 };
enum { kPassed = 0, kFailed = 1, kNoGpu = 2, kDriverTooOld = 3 };
enum { kN = 1 << 20 };
static const long long kSlowFillNanoseconds = 200 * 1000 * 1000;

static int check(CUresult rc, const char* what) {
  if (rc != 0) fprintf(stderr, "stream_harness: %s: CUDA error %d\n", what, rc);
  return rc == 0;
}

static int load_driver(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) return 0;
#define SYM(field, name)                            \
  if ((*(void**)(&cu.field) = dlsym(lib, name)) == NULL) { \
    fprintf(stderr, "stream_harness: libcuda.so.1 lacks %s\n", name); \
    return 0;                                        \
  }
  SYM(init, "cuInit");
  SYM(driver_get_version, "cuDriverGetVersion");
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
#undef SYM
  return 1;
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
                        float* host, int* returned_early) {
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
  fill_args[2].v_int64 = kSlowFillNanoseconds;
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

// Loads `name` from the library at `path` into *fn.
static int load_function(const char* path, const char* name, DsoopFunction* fn) {
  DsoopError err = {NULL, NULL};
  TVMFFIObjectHandle module = NULL;
  if (dsoop_module_load(path, &module, &err) != 0 ||
      dsoop_module_get_function(module, name, fn, &err) != 1) {
    fprintf(stderr, "stream_harness: %s from %s: %s: %s\n", name, path, err.kind ? err.kind : "",
            err.message ? err.message : "function missing");
    dsoop_error_clear(&err);
    return 0;
  }
  return 1;  // the module stays loaded: fn holds a reference into it
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: stream_harness LIBTVM_FFI.so SLOW_FILL.so TVM_ADD_ONE.so\n");
    return kFailed;
  }
  // Load every kernel when its library loads: CUDA's lazy loading would load
  // them at their first launch, which may synchronise the context, and the first
  // launches happen inside the timed sequence.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  if (!load_driver()) {
    fprintf(stderr, "stream_harness: no CUDA driver (libcuda.so.1): no GPU here\n");
    return kNoGpu;
  }
  CUresult rc = cu.init(0);
  if (rc == kNoDevice) {
    fprintf(stderr, "stream_harness: the CUDA driver sees no GPU\n");
    return kNoGpu;
  }
  CUdevice device;
  CUcontext context;
  if (!check(rc, "cuInit") || !check(cu.device_get(&device, 0), "device 0")) return kFailed;
  // The libraries link CUDA 13's runtime (as apache-tvm 0.27's CUDA runtime does),
  // which needs a driver for CUDA 13 or newer.
  int driver_version = 0;
  if (!check(cu.driver_get_version(&driver_version), "driver version")) return kFailed;
  printf("CUDA driver API %d.%d\n", driver_version / 1000, driver_version % 1000 / 10);
  if (driver_version < 13000) {
    fprintf(stderr, "stream_harness: the driver is older than CUDA 13, which the libraries need\n");
    return kDriverTooOld;
  }
  if (!check(cu.primary_ctx_retain(&context, device), "context") ||
      !check(cu.ctx_set_current(context), "context")) {
    return kFailed;
  }
  DsoopError err = {NULL, NULL};
  if (dsoop_runtime_init(argv[1], "", &err) != 0) {
    fprintf(stderr, "stream_harness: %s: %s\n", err.kind, err.message);
    return kFailed;
  }
  DsoopFunction slow_fill, add_one;
  if (!load_function(argv[2], "slow_fill", &slow_fill) || !load_function(argv[3], "add_one", &add_one)) {
    return kFailed;
  }

  CUstream stream;
  CUdeviceptr a, b;
  float* host = (float*)malloc(kN * sizeof(float));
  if (host == NULL || !check(cu.stream_create(&stream, kNonBlocking), "stream") ||
      !check(cu.mem_alloc(&a, kN * sizeof(float)), "alloc") ||
      !check(cu.mem_alloc(&b, kN * sizeof(float)), "alloc")) {
    return kFailed;
  }

  // A first run, not checked: the first calls of each library initialise its CUDA
  // runtime, which must not fall inside the timed sequence.
  int early = 0;
  if (!run_sequence(&slow_fill, &add_one, stream, stream, a, b, host, &early)) return kFailed;

  // 1: everything on a TF-like non-blocking stream, no synchronisation between.
  if (!run_sequence(&slow_fill, &add_one, stream, stream, a, b, host, &early)) return kFailed;
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += host[i] != 42.0f;
  printf("same stream: %d of %d values wrong (want 0); our calls returned %s the long kernel ended\n",
         wrong, kN, early ? "before" : "AFTER");

  // 2: TVM on the legacy default stream (NULL), as the old op ran it.
  int control_early = 0;
  if (!run_sequence(&slow_fill, &add_one, NULL, stream, a, b, host, &control_early)) return kFailed;
  int stale = 0;
  for (int i = 0; i < kN; ++i) stale += host[i] == 1.0f;
  printf("legacy default stream (contrast): %d of %d values computed from the unwritten buffer%s\n",
         stale, kN, stale == 0 ? " (the race did not show this time)" : "");

  free(host);
  return wrong == 0 && early ? kPassed : kFailed;
}
