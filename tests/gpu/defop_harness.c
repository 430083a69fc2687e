// defop_harness: the CUDA variants of a defop library (tests/gpu/defop_ops.py,
// built by build_ops for sm_90 on a machine without a GPU: build_defops.py) on a
// real GPU, through the launch code the TF GPU kernel uses for them,
// dsoop_function_call_on_stream, without TensorFlow (no GPU build of TF is at
// hand). The library is loaded by TVM's own loader through dsoop, with TVM's CUDA
// runtime (opened as the op opens it) loading its kernels. For each variant
// the inputs are copied in, the variant called and the outputs copied out, all
// queued on one NON-BLOCKING stream (as TF's are) with no synchronisation before
// the end; the outputs are checked against references computed here in double
// precision. Sizes are no multiple of the schedule's 256 threads a block, so the
// last block's bounds check is exercised too.
//
//   defop_harness LIBTVM_FFI.so LIBTVM_RUNTIME.so LIBCUDART.so LIBTVM_RUNTIME_CUDA.so DEFOP_OPS_CUDA.so
//
// Exit status 0 when every variant's values match, 1 when not, 2 with no GPU, 3
// when the driver is older than CUDA 13.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsoop/dsoop.h"
#include "tests/gpu/cuda_driver.h"

enum { kMaxInputs = 2, kMaxDims = 3, kTimedCalls = 50 };

// What a variant computes, for the reference.
typedef enum { kAdd, kSwishBias, kRowSum, kColSum } Kind;

typedef struct {
  const char* function;
  Kind kind;
  int is_int32;  // int32 data, else float32
  int num_inputs;
  int ndim[kMaxInputs];
  int64_t shape[kMaxInputs][kMaxDims];
  int out_ndim;
  int64_t out_shape[kMaxDims];
} Variant;

static const Variant kVariants[] = {
    {"vadd_float32_1d", kAdd, 0, 2, {1, 1}, {{1000003}, {1000003}}, 1, {1000003}},
    {"vadd_float32_2d", kAdd, 0, 2, {2, 2}, {{517, 1031}, {517, 1031}}, 2, {517, 1031}},
    {"vadd_float32_3d", kAdd, 0, 2, {3, 3}, {{7, 65, 129}, {7, 65, 129}}, 3, {7, 65, 129}},
    {"vadd_int32_1d", kAdd, 1, 2, {1, 1}, {{1000003}, {1000003}}, 1, {1000003}},
    {"vadd_int32_2d", kAdd, 1, 2, {2, 2}, {{517, 1031}, {517, 1031}}, 2, {517, 1031}},
    {"vadd_int32_3d", kAdd, 1, 2, {3, 3}, {{7, 65, 129}, {7, 65, 129}}, 3, {7, 65, 129}},
    {"swish_bias_float32_2d", kSwishBias, 0, 2, {2, 1}, {{2048, 2048}, {2048}}, 2, {2048, 2048}},
    {"row_sum_float32_2d", kRowSum, 0, 1, {2}, {{1000, 777}}, 1, {1000}},
    {"col_sum_float32_2d", kColSum, 0, 1, {2}, {{777, 1000}}, 1, {1000}},
};

static int64_t num_elements(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// A tensor of the variant's dtype over device memory, as packed argument `arg`.
static void set_tensor(DLTensor* t, TVMFFIAny* arg, CUdeviceptr data, int is_int32, int ndim,
                       int64_t* shape) {
  memset(t, 0, sizeof(*t));
  t->data = (void*)(uintptr_t)data;
  t->device.device_type = kDLCUDA;
  t->device.device_id = 0;
  t->ndim = ndim;
  t->dtype.code = is_int32 ? kDLInt : kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = shape;
  arg->type_index = kTVMFFIDLTensorPtr;
  arg->zero_padding = 0;
  arg->v_ptr = t;
}

// Input i's element j: floats in [-4, 4], ints in [-1000, 1000].
static void fill(const Variant* v, int i, void* data, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const double x = sin(0.37 * (double)j + 1.3 * i);
    if (v->is_int32) {
      ((int32_t*)data)[j] = (int32_t)lround(1000 * x);
    } else {
      ((float*)data)[j] = (float)(4 * x);
    }
  }
}

// The largest difference of the output from the reference, each scaled by the
// tolerance of its kind (so <= 1 passes).
static double worst_error(const Variant* v, void* const* in, const void* out) {
  const int64_t n = num_elements(v->out_ndim, v->out_shape);
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    double want = 0, got = 0, tolerance = 0;
    switch (v->kind) {
      case kAdd:  // exact: one addition in the variant's own type
        if (v->is_int32) {
          want = (double)(((const int32_t*)in[0])[j] + ((const int32_t*)in[1])[j]);
          got = ((const int32_t*)out)[j];
        } else {
          want = (double)(((const float*)in[0])[j] + ((const float*)in[1])[j]);
          got = ((const float*)out)[j];
        }
        break;
      case kSwishBias: {
        const double s = (double)((const float*)in[0])[j] + ((const float*)in[1])[j % v->shape[0][1]];
        want = s / (1 + exp(-s));
        got = ((const float*)out)[j];
        tolerance = 1e-6 + 1e-5 * fabs(want);
        break;
      }
      case kRowSum: {
        const int64_t cols = v->shape[0][1];
        for (int64_t k = 0; k < cols; ++k) want += ((const float*)in[0])[j * cols + k];
        got = ((const float*)out)[j];
        tolerance = 1e-6 * (double)cols;  // a float sum's rounding, with room
        break;
      }
      case kColSum: {
        const int64_t rows = v->shape[0][0], cols = v->shape[0][1];
        for (int64_t k = 0; k < rows; ++k) want += ((const float*)in[0])[k * cols + j];
        got = ((const float*)out)[j];
        tolerance = 1e-6 * (double)rows;
        break;
      }
    }
    const double err = fabs(got - want);
    const double scaled = tolerance > 0 ? err / tolerance : (err > 0 ? INFINITY : 0);
    if (!(scaled <= worst)) worst = scaled;  // a NaN counts as the worst
  }
  return worst;
}

// Runs variant v of the library on CUDA device 0. *ok gets whether its values
// match; *us the GPU time of a call (CUDA events, kTimedCalls calls); *bytes
// what a call reads and writes (its inputs and output).
static int run(const Variant* v, TVMFFIObjectHandle module, CUstream stream, int* ok, double* us,
               double* bytes) {
  DsoopError err = {NULL, NULL};
  DsoopFunction fn;
  if (dsoop_module_get_function(module, v->function, &fn, &err) != 1) {
    fprintf(stderr, "defop_harness: no function %s: %s\n", v->function,
            err.message ? err.message : "missing");
    dsoop_error_clear(&err);
    return 0;
  }
  DLTensor tensors[kMaxInputs + 1];
  TVMFFIAny args[kMaxInputs + 1];
  int64_t shapes[kMaxInputs + 1][kMaxDims];
  void* host[kMaxInputs + 1] = {NULL};
  CUdeviceptr device[kMaxInputs + 1] = {0};
  size_t sizes[kMaxInputs + 1];
  const int count = v->num_inputs + 1;
  *bytes = 0;
  for (int i = 0; i < count; ++i) {
    const int is_output = i == v->num_inputs;
    const int ndim = is_output ? v->out_ndim : v->ndim[i];
    memcpy(shapes[i], is_output ? v->out_shape : v->shape[i], sizeof(shapes[i]));
    const int64_t n = num_elements(ndim, shapes[i]);
    sizes[i] = (size_t)n * 4;
    *bytes += (double)sizes[i];
    host[i] = malloc(sizes[i]);
    if (host[i] == NULL || !check(cu.mem_alloc(&device[i], sizes[i]), "alloc")) return 0;
    if (is_output) {
      // A pattern the kernel must overwrite everywhere.
      if (!check(cu.memset_d32(device[i], 0x7fc00000u, (size_t)n), "memset")) return 0;
    } else {
      fill(v, i, host[i], n);
      if (!check(cu.memcpy_htod_async(device[i], host[i], sizes[i], stream), "copy in")) return 0;
    }
    set_tensor(&tensors[i], &args[i], device[i], v->is_int32, ndim, shapes[i]);
  }
  const int output = v->num_inputs;
  if (dsoop_function_call_on_stream(&fn, args, count, kDLCUDA, 0, stream, &err) != 0) {
    fprintf(stderr, "defop_harness: %s: %s: %s\n", v->function, err.kind, err.message);
    dsoop_error_clear(&err);
    return 0;
  }
  if (!check(cu.memcpy_dtoh_async(host[output], device[output], sizes[output], stream), "copy out") ||
      !check(cu.stream_synchronize(stream), "synchronize")) {
    return 0;
  }
  const double worst = worst_error(v, host, host[output]);
  *ok = worst <= 1;
  // Timed: kTimedCalls calls between two events on the stream.
  CUevent e[2];
  float ms = 0;
  if (!check(cu.event_create(&e[0], 0), "event") || !check(cu.event_create(&e[1], 0), "event") ||
      !check(cu.event_record(e[0], stream), "event")) {
    return 0;
  }
  for (int c = 0; c < kTimedCalls; ++c) {
    if (dsoop_function_call_on_stream(&fn, args, count, kDLCUDA, 0, stream, &err) != 0) {
      fprintf(stderr, "defop_harness: %s: %s: %s\n", v->function, err.kind, err.message);
      dsoop_error_clear(&err);
      return 0;
    }
  }
  if (!check(cu.event_record(e[1], stream), "event") || !check(cu.event_synchronize(e[1]), "event") ||
      !check(cu.event_elapsed_time(&ms, e[0], e[1]), "elapsed")) {
    return 0;
  }
  *us = 1e3 * ms / kTimedCalls;
  printf("%s: %s (worst error %.2f of its tolerance)\n", v->function, *ok ? "match" : "MISMATCH", worst);
  for (int i = 0; i < count; ++i) free(host[i]);  // device buffers go with the process
  dsoop_object_release(fn.handle);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr,
            "usage: defop_harness LIBTVM_FFI.so LIBTVM_RUNTIME.so LIBCUDART.so "
            "LIBTVM_RUNTIME_CUDA.so DEFOP_OPS_CUDA.so\n");
    return kFailed;
  }
  CUdevice device;
  int driver_version = 0;
  const int started = start_cuda("defop_harness", &device, &driver_version);
  if (started != kPassed) return started;
  DsoopError err = {NULL, NULL};
  TVMFFIObjectHandle module = NULL;
  // TVM's runtime, the CUDA runtime it links, and TVM's CUDA runtime, which loads
  // the library's kernels: opened as the op opens them.
  if (dsoop_runtime_init(argv[1], argv[2], &err) != 0 || dsoop_load_extension(argv[3], &err) != 0 ||
      dsoop_load_extension(argv[4], &err) != 0 || dsoop_module_load(argv[5], &module, &err) != 0) {
    fprintf(stderr, "defop_harness: %s: %s\n", err.kind, err.message);
    dsoop_error_clear(&err);
    return kFailed;
  }
  CUstream stream;
  if (!check(cu.stream_create(&stream, kNonBlocking), "stream")) return kFailed;
  int all_match = 1;
  for (size_t k = 0; k < sizeof(kVariants) / sizeof(kVariants[0]); ++k) {
    int ok = 0;
    double us = 0, bytes = 0;
    if (!run(&kVariants[k], module, stream, &ok, &us, &bytes)) return kFailed;
    printf("  %.1f us a call on the GPU, %.0f GB/s of its inputs and output\n", us, bytes / (us * 1e3));
    all_match &= ok;
  }
  dsoop_object_release(module);
  return all_match ? kPassed : kFailed;
}
