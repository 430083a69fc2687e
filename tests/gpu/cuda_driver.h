// cuda_driver.h: the part of the CUDA driver API the GPU programs use
// (stream_harness, model_harness), opened at run time so that they build without
// a CUDA toolkit, and their common start: a driver for CUDA 13 (which apache-tvm
// 0.27's CUDA runtime and the test libraries link), device 0, its primary
// context. Header-only: each program is one C file plus this.
#ifndef TVMDSOOP_TESTS_GPU_CUDA_DRIVER_H_
#define TVMDSOOP_TESTS_GPU_CUDA_DRIVER_H_

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;
typedef unsigned long long CUdeviceptr;
typedef void* CUevent;

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
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*device_get_name)(char*, int, CUdevice);
  CUresult (*event_create)(CUevent*, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_synchronize)(CUevent);
  CUresult (*event_elapsed_time)(float*, CUevent, CUevent);
} cu;

enum { kNonBlocking = 1, kNoDevice = 100, kNotReady = 600 };
// Exit statuses of the GPU programs.
enum { kPassed = 0, kFailed = 1, kNoGpu = 2, kDriverTooOld = 3 };

// The program's name, for messages.
static const char* cuda_program = "cuda";

static int check(CUresult rc, const char* what) {
  if (rc != 0) fprintf(stderr, "%s: %s: CUDA error %d\n", cuda_program, what, rc);
  return rc == 0;
}

static int load_driver(void) {
  // The driver, opened at run time: the programs build without a CUDA toolkit.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) return 0;
#define SYM(field, name)                            \
  if ((*(void**)(&cu.field) = dlsym(lib, name)) == NULL) { \
    fprintf(stderr, "%s: libcuda.so.1 lacks %s\n", cuda_program, name); \
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
  SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  SYM(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
  SYM(device_get_name, "cuDeviceGetName");
  SYM(event_create, "cuEventCreate");
  SYM(event_record, "cuEventRecord");
  SYM(event_synchronize, "cuEventSynchronize");
#undef SYM
  // The _v2 name since CUDA 12.8; older drivers have only the first.
  *(void**)(&cu.event_elapsed_time) = dlsym(lib, "cuEventElapsedTime_v2");
  if (cu.event_elapsed_time == NULL) *(void**)(&cu.event_elapsed_time) = dlsym(lib, "cuEventElapsedTime");
  if (cu.event_elapsed_time == NULL) {
    fprintf(stderr, "%s: libcuda.so.1 lacks cuEventElapsedTime\n", cuda_program);
    return 0;
  }
  return 1;
}

// Opens the driver and makes device 0's primary context current. Returns
// kPassed, or the exit status to stop with (kNoGpu, kDriverTooOld, kFailed).
static int start_cuda(const char* program, CUdevice* device, int* driver_version) {
  cuda_program = program;
  // Load every kernel when its library loads: CUDA's lazy loading would load
  // them at their first launch, which may synchronise the context, and the first
  // launches may fall inside a timed or ordered sequence.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  if (!load_driver()) {
    fprintf(stderr, "%s: no CUDA driver (libcuda.so.1): no GPU here\n", program);
    return kNoGpu;
  }
  CUresult rc = cu.init(0);
  if (rc == kNoDevice) {
    fprintf(stderr, "%s: the CUDA driver sees no GPU\n", program);
    return kNoGpu;
  }
  CUcontext context;
  if (!check(rc, "cuInit") || !check(cu.device_get(device, 0), "device 0")) return kFailed;
  if (!check(cu.driver_get_version(driver_version), "driver version")) return kFailed;
  printf("CUDA driver API %d.%d\n", *driver_version / 1000, *driver_version % 1000 / 10);
  if (*driver_version < 13000) {
    fprintf(stderr, "%s: the driver is older than CUDA 13, which the libraries need\n", program);
    return kDriverTooOld;
  }
  if (!check(cu.primary_ctx_retain(&context, *device), "context") ||
      !check(cu.ctx_set_current(context), "context")) {
    return kFailed;
  }
  return kPassed;
}

#endif  // TVMDSOOP_TESTS_GPU_CUDA_DRIVER_H_
