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
//      on CUDA's legacy default stream reads the buffer before it is written;
//   3. ordering under stress: kStressCalls rounds of slow_fill(a, i) then
//      add_one(a -> slice i of a large buffer), all queued on one stream with no
//      synchronisation, then every value checked (slice i must hold i + 1);
//
// and measures, side by side on the same stream:
//
//   4. the call overhead of our launch path (TF's stream set as TVM's, the call,
//      the restore) over a raw launch of the same TVM kernel (raw_add_one, in
//      tvm_add_one.so): host time a call, medians of interleaved rounds;
//   5. the bandwidth of a large add_one through our path against a
//      device-to-device copy of the same bytes (CUDA events on the stream).
//
//   stream_harness LIBTVM_FFI.so SLOW_FILL.so TVM_ADD_ONE.so [RESULTS.json]
//
// RESULTS.json gets the figures (gpu_call_overhead_us, gpu_bw_ratio_vs_d2d, ...).
// The CUDA driver is loaded at run time (no toolkit needed to build). Exit status
// 0 when 1 and 3 hold, 1 when not, 2 when there is no GPU (no driver, or no
// device), 3 when the driver is older than CUDA 13, which the libraries need.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsoop/dsoop.h"
#include "tests/gpu/cuda_driver.h"

// raw_add_one from tvm_add_one.so: TVM's kernel launched directly.
typedef int (*RawAddOne)(float* x, float* y, int n, void* stream);

enum { kN = 1 << 20 };
static const long long kSlowFillNanoseconds = 200 * 1000 * 1000;
// Ordering under stress: rounds, floats a round, GPU time of each slow_fill.
enum { kStressCalls = 2000, kStressN = 1 << 14 };
static const long long kStressFillNanoseconds = 20 * 1000;
// Call overhead: floats a call, calls a round, rounds.
enum { kOverheadN = 256, kOverheadCalls = 200, kOverheadRounds = 51 };
// Bandwidth: floats (256 MiB), rounds.
enum { kBandwidthN = 1 << 26, kBandwidthRounds = 21 };

// The goals of the measurements (issue: GPU proof), printed beside the figures.
static const double kOverheadGoalUs = 3.0;
static const double kBandwidthGoalRatio = 0.85;

// A float32 vector of shape[0] elements at `data` on CUDA device 0, as argument `arg`.
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

// Calls fn through dsoop on `stream` (TVM's current stream set to it), as the TF
// GPU kernel does; reports a failure.
static int call_on(const DsoopFunction* fn, TVMFFIAny* args, int n, CUstream stream) {
  DsoopError err = {NULL, NULL};
  if (dsoop_function_call_on_stream(fn, args, n, kDLCUDA, 0, stream, &err) != 0) {
    fprintf(stderr, "stream_harness: %s: %s\n", err.kind, err.message);
    dsoop_error_clear(&err);
    return 0;
  }
  return 1;
}

// 3: kStressCalls rounds of slow_fill(a, i) then add_one(a -> out slice i) on one
// stream, nothing synchronised until the end. If add_one ever ran before its
// slow_fill, or the next slow_fill before it, slice i would not hold i + 1.
// Returns the number of wrong values, or -1 on a CUDA or TVM failure.
static long stress(const DsoopFunction* slow_fill, const DsoopFunction* add_one, CUstream stream) {
  const size_t total = (size_t)kStressCalls * kStressN;
  CUdeviceptr a, out;
  float* host = (float*)malloc(total * sizeof(float));
  if (host == NULL || !check(cu.mem_alloc(&a, kStressN * sizeof(float)), "alloc") ||
      !check(cu.mem_alloc(&out, total * sizeof(float)), "alloc") ||
      !check(cu.memset_d32(out, 0, total), "memset") || !check(cu.ctx_synchronize(), "synchronize")) {
    free(host);
    return -1;
  }
  int64_t shape[1] = {kStressN};
  DLTensor ta, tout;
  TVMFFIAny fill_args[3], add_args[2];
  set_tensor(&ta, &fill_args[0], a, shape);
  fill_args[1].type_index = kTVMFFIFloat;
  fill_args[1].zero_padding = 0;
  fill_args[2].type_index = kTVMFFIInt;
  fill_args[2].zero_padding = 0;
  fill_args[2].v_int64 = kStressFillNanoseconds;
  set_tensor(&ta, &add_args[0], a, shape);
  for (int i = 0; i < kStressCalls; ++i) {
    fill_args[1].v_float64 = (double)i;
    set_tensor(&tout, &add_args[1], out + (CUdeviceptr)i * kStressN * sizeof(float), shape);
    if (!call_on(slow_fill, fill_args, 3, stream) || !call_on(add_one, add_args, 2, stream)) {
      free(host);
      return -1;
    }
  }
  if (!check(cu.memcpy_dtoh_async(host, out, total * sizeof(float), stream), "copy out") ||
      !check(cu.ctx_synchronize(), "synchronize")) {
    free(host);
    return -1;
  }
  long wrong = 0;
  for (size_t k = 0; k < total; ++k) wrong += host[k] != (float)(k / kStressN) + 1.0f;
  free(host);
  return wrong;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare_doubles(const void* x, const void* y) {
  const double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

static double median(double* v, int n) {
  qsort(v, n, sizeof(double), compare_doubles);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// 4: host time a call of add_one on a small vector, through dsoop (stream set,
// call, restore; TVM's host code checks the arguments and launches) and through
// raw_add_one, in interleaved rounds of kOverheadCalls calls (few enough that the
// launch queue never fills, so the host's cost is what is timed).
static int measure_overhead(const DsoopFunction* add_one, RawAddOne raw, CUstream stream,
                            double* ours_us, double* raw_us) {
  CUdeviceptr a, b;
  if (!check(cu.mem_alloc(&a, kOverheadN * sizeof(float)), "alloc") ||
      !check(cu.mem_alloc(&b, kOverheadN * sizeof(float)), "alloc")) {
    return 0;
  }
  int64_t shape[1] = {kOverheadN};
  DLTensor ta, tb;
  TVMFFIAny args[2];
  set_tensor(&ta, &args[0], a, shape);
  set_tensor(&tb, &args[1], b, shape);
  double ours[kOverheadRounds], raws[kOverheadRounds];
  for (int round = -1; round < kOverheadRounds; ++round) {  // round -1 warms up
    for (int which = 0; which < 2; ++which) {
      const int use_ours = (which + round) % 2 == 0;  // alternate which goes first
      if (!check(cu.stream_synchronize(stream), "synchronize")) return 0;
      const double start = now_us();
      for (int i = 0; i < kOverheadCalls; ++i) {
        if (use_ours ? !call_on(add_one, args, 2, stream)
                     : !check(raw((float*)(uintptr_t)a, (float*)(uintptr_t)b, kOverheadN, stream),
                              "raw launch")) {
          return 0;
        }
      }
      const double per_call = (now_us() - start) / kOverheadCalls;
      if (round >= 0) (use_ours ? ours : raws)[round] = per_call;
    }
  }
  if (!check(cu.stream_synchronize(stream), "synchronize")) return 0;
  *ours_us = median(ours, kOverheadRounds);
  *raw_us = median(raws, kOverheadRounds);
  return 1;
}

// 5: GPU time of add_one over kBandwidthN floats through dsoop, and of a
// device-to-device copy of the same bytes (both read and write them once), in
// interleaved rounds timed by events on the stream. *ratio is the median of the
// rounds' copy time / add_one time; the rates count bytes read plus written.
static int measure_bandwidth(const DsoopFunction* add_one, CUstream stream, double* ratio,
                             double* ours_gbps, double* copy_gbps) {
  const size_t bytes = (size_t)kBandwidthN * sizeof(float);
  CUdeviceptr a, b;
  CUevent e[4];
  if (!check(cu.mem_alloc(&a, bytes), "alloc") || !check(cu.mem_alloc(&b, bytes), "alloc") ||
      !check(cu.memset_d32(a, 0, kBandwidthN), "memset")) {
    return 0;
  }
  for (int i = 0; i < 4; ++i) {
    if (!check(cu.event_create(&e[i], 0), "event")) return 0;
  }
  int64_t shape[1] = {kBandwidthN};
  DLTensor ta, tb;
  TVMFFIAny args[2];
  set_tensor(&ta, &args[0], a, shape);
  set_tensor(&tb, &args[1], b, shape);
  double ratios[kBandwidthRounds], ours_ms[kBandwidthRounds], copy_ms[kBandwidthRounds];
  for (int round = -1; round < kBandwidthRounds; ++round) {  // round -1 warms up
    if (!check(cu.event_record(e[0], stream), "event") || !call_on(add_one, args, 2, stream) ||
        !check(cu.event_record(e[1], stream), "event") ||
        !check(cu.event_record(e[2], stream), "event") ||
        !check(cu.memcpy_dtod_async(b, a, bytes, stream), "copy") ||
        !check(cu.event_record(e[3], stream), "event") ||
        !check(cu.event_synchronize(e[3]), "event")) {
      return 0;
    }
    float t_ours = 0, t_copy = 0;
    if (!check(cu.event_elapsed_time(&t_ours, e[0], e[1]), "elapsed") ||
        !check(cu.event_elapsed_time(&t_copy, e[2], e[3]), "elapsed")) {
      return 0;
    }
    if (round < 0) continue;
    ratios[round] = t_copy / t_ours;
    ours_ms[round] = t_ours;
    copy_ms[round] = t_copy;
  }
  *ratio = median(ratios, kBandwidthRounds);
  *ours_gbps = 2.0 * bytes / (median(ours_ms, kBandwidthRounds) * 1e-3) / 1e9;
  *copy_gbps = 2.0 * bytes / (median(copy_ms, kBandwidthRounds) * 1e-3) / 1e9;
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
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: stream_harness LIBTVM_FFI.so SLOW_FILL.so TVM_ADD_ONE.so [RESULTS.json]\n");
    return kFailed;
  }
  CUdevice device;
  int driver_version = 0;
  const int started = start_cuda("stream_harness", &device, &driver_version);
  if (started != kPassed) return started;
  DsoopError err = {NULL, NULL};
  if (dsoop_runtime_init(argv[1], "", &err) != 0) {
    fprintf(stderr, "stream_harness: %s: %s\n", err.kind, err.message);
    return kFailed;
  }
  DsoopFunction slow_fill, add_one;
  if (!load_function(argv[2], "slow_fill", &slow_fill) || !load_function(argv[3], "add_one", &add_one)) {
    return kFailed;
  }
  // TVM's loader has the library open already: this finds the same copy.
  void* add_one_library = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
  RawAddOne raw_add_one = add_one_library ? (RawAddOne)dlsym(add_one_library, "raw_add_one") : NULL;
  if (raw_add_one == NULL) {
    fprintf(stderr, "stream_harness: %s has no raw_add_one\n", argv[3]);
    return kFailed;
  }
  char gpu_name[256] = "";
  if (!check(cu.device_get_name(gpu_name, sizeof(gpu_name), device), "device name")) return kFailed;
  printf("GPU: %s\n", gpu_name);

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

  // 3: ordering under stress.
  const long stress_wrong = stress(&slow_fill, &add_one, stream);
  if (stress_wrong < 0) return kFailed;
  printf("stress: %d rounds of slow_fill then add_one on one stream: %ld of %ld values wrong (want 0)\n",
         kStressCalls, stress_wrong, (long)kStressCalls * kStressN);

  // 4 and 5: the figures.
  double ours_us = 0, raw_us = 0, bw_ratio = 0, ours_gbps = 0, copy_gbps = 0;
  if (!measure_overhead(&add_one, raw_add_one, stream, &ours_us, &raw_us) ||
      !measure_bandwidth(&add_one, stream, &bw_ratio, &ours_gbps, &copy_gbps)) {
    return kFailed;
  }
  const double overhead_us = ours_us - raw_us;
  printf("call overhead: %.2f us a call through dsoop, %.2f us a raw launch: %.2f us more (goal <= %.1f)\n",
         ours_us, raw_us, overhead_us, kOverheadGoalUs);
  printf("bandwidth: add_one %.0f GB/s, device-to-device copy %.0f GB/s: ratio %.3f (goal >= %.2f)\n",
         ours_gbps, copy_gbps, bw_ratio, kBandwidthGoalRatio);

  if (argc == 5) {
    FILE* f = fopen(argv[4], "w");
    if (f == NULL) {
      perror(argv[4]);
      return kFailed;
    }
    fprintf(f,
            "{\n  \"gpu_name\": \"%s\",\n  \"gpu_cuda_driver_api\": \"%d.%d\",\n"
            "  \"gpu_call_overhead_us\": %.3f,\n  \"gpu_call_us\": %.3f,\n  \"gpu_raw_launch_us\": %.3f,\n"
            "  \"gpu_bw_ratio_vs_d2d\": %.4f,\n  \"gpu_add_one_gbps\": %.1f,\n  \"gpu_d2d_copy_gbps\": %.1f,\n"
            "  \"gpu_bandwidth_bytes\": %ld,\n  \"gpu_stress_calls\": %d,\n  \"gpu_stress_wrong\": %ld,\n"
            "  \"gpu_same_stream_wrong\": %d\n}\n",
            gpu_name, driver_version / 1000, driver_version % 1000 / 10, overhead_us, ours_us, raw_us,
            bw_ratio, ours_gbps, copy_gbps, (long)kBandwidthN * (long)sizeof(float), kStressCalls,
            stress_wrong, wrong);
    fclose(f);
  }
  return wrong == 0 && early && stress_wrong == 0 ? kPassed : kFailed;
}
