// model_harness: whole models (Relax VM executables) on a real GPU, through the
// VM path the TF kernels use (dsoop/vm.c: a pool of VM instances, inputs lent
// as Tensor objects, TVM's current stream set to the caller's), without
// TensorFlow (no GPU build of TF is at hand). For each model it runs the
// library compiled for the CPU (NAME.so) and the one compiled for CUDA
// (NAME_cuda.so, sm_90 code compiled on a machine without a GPU:
// tests/modules/build_models.py) on the same inputs, the GPU one on a
// NON-BLOCKING stream as TF's are, with the inputs copied in and the outputs
// copied out on that stream and no synchronisation before the end, and
// compares the outputs.
//
//   model_harness LIBTVM_FFI.so LIBTVM_RUNTIME.so LIBCUDART.so LIBTVM_RUNTIME_CUDA.so MODELS_DIR
//
// Exit status 0 when every model's outputs match, 1 when not, 2 with no GPU, 3
// when the driver is older than CUDA 13.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsoop/dsoop.h"
#include "dsoop/vm.h"
#include "tests/gpu/cuda_driver.h"

enum { kMaxInputs = 5, kMaxOutputs = 4, kMaxDims = 4, kTimedCalls = 50 };
static const double kTolerance = 1e-4;

// A model of build_models.py: its library stem, function and float32 inputs.
typedef struct {
  const char* stem;
  const char* function;
  int num_inputs;
  int ndim[kMaxInputs];
  int64_t shape[kMaxInputs][kMaxDims];
} Model;

static const Model kModels[] = {
    {"mlp", "forward", 5, {2, 2, 1, 2, 1}, {{8, 16}, {32, 16}, {32}, {8, 32}, {8}}},
    {"cnn_b4", "main", 1, {4}, {{4, 16, 16, 3}}},
    {"onnx_model", "main", 2, {2, 2}, {{6, 8}, {6, 4}}},
};

static int64_t num_elements(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// The harness owns every buffer: TVM's view of it needs no deleter.
static void keep(DLManagedTensor* self) { (void)self; }

// A Tensor object over float32 memory at data on device.
static int lend(void* data, DLDevice device, int ndim, int64_t* shape, DLManagedTensor* m,
                TVMFFIObjectHandle* out, DsoopError* err) {
  memset(m, 0, sizeof(*m));
  m->dl_tensor.data = data;
  m->dl_tensor.device = device;
  m->dl_tensor.ndim = ndim;
  m->dl_tensor.dtype.code = kDLFloat;
  m->dl_tensor.dtype.bits = 32;
  m->dl_tensor.dtype.lanes = 1;
  m->dl_tensor.shape = shape;
  m->deleter = keep;
  return dsoop_tensor_from_dlpack(m, out, err);
}

static int fail(const char* what, DsoopError* err) {
  fprintf(stderr, "model_harness: %s: %s: %s\n", what, err->kind ? err->kind : "",
          err->message ? err->message : "");
  dsoop_error_clear(err);
  return 0;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

// Outputs of one run, in host memory.
typedef struct {
  int count;
  int64_t size[kMaxOutputs];
  float* data[kMaxOutputs];
} Outputs;

static void free_outputs(Outputs* o) {
  for (int i = 0; i < o->count; ++i) free(o->data[i]);
  o->count = 0;
}

// Runs model m of the library at path on device (the CPU, or CUDA device 0 with
// stream), with inputs from host memory, and copies the outputs to host memory.
// On CUDA, nothing is synchronised between the copies in, the call and the
// copies out: all are on stream. *us gets the time of a call, from kTimedCalls.
static int run(const Model* m, const char* path, DLDevice device, CUstream stream, float** inputs,
               Outputs* out, double* us) {
  DsoopError err = {NULL, NULL};
  TVMFFIObjectHandle module = NULL;
  if (dsoop_module_load(path, &module, &err) != 0) return fail(path, &err);
  DsoopVMPool* pool = NULL;
  const int vm_ok = dsoop_vm_pool_create(module, device.device_type, device.device_id, 2, &pool, &err);
  dsoop_object_release(module);  // the pool holds its own reference
  if (vm_ok != 0) return fail(path, &err);
  int32_t index = 0;
  int64_t arity = 0;
  if (dsoop_vm_pool_function(pool, m->function, &index, &arity, &err) != 1 || arity != m->num_inputs) {
    fprintf(stderr, "model_harness: %s: no function %s of %d inputs (arity %lld)\n", path, m->function,
            m->num_inputs, (long long)arity);
    dsoop_error_clear(&err);
    return 0;
  }
  const int on_gpu = device.device_type == kDLCUDA;
  DLManagedTensor managed[kMaxInputs];
  TVMFFIAny args[kMaxInputs];
  CUdeviceptr device_inputs[kMaxInputs] = {0};
  int64_t shapes[kMaxInputs][kMaxDims];
  for (int i = 0; i < m->num_inputs; ++i) {
    memcpy(shapes[i], m->shape[i], sizeof(shapes[i]));
    const size_t bytes = (size_t)num_elements(m->ndim[i], m->shape[i]) * sizeof(float);
    void* data = inputs[i];
    if (on_gpu) {
      if (!check(cu.mem_alloc(&device_inputs[i], bytes), "alloc") ||
          !check(cu.memcpy_htod_async(device_inputs[i], inputs[i], bytes, stream), "copy in")) {
        return 0;
      }
      data = (void*)(uintptr_t)device_inputs[i];
    }
    TVMFFIObjectHandle handle = NULL;
    if (lend(data, device, m->ndim[i], shapes[i], &managed[i], &handle, &err) != 0) return fail("lend", &err);
    args[i].type_index = kTVMFFITensor;
    args[i].zero_padding = 0;
    args[i].v_obj = (TVMFFIObject*)handle;
  }
  TVMFFIAny result;
  if (dsoop_vm_call(pool, index, args, m->num_inputs, stream, &result, &err) != 0) {
    return fail(m->function, &err);
  }
  TVMFFIObjectHandle tensors[kMaxOutputs];
  const int count = dsoop_result_tensors(&result, tensors, kMaxOutputs, &err);
  dsoop_any_release(&result);
  if (count < 0 || count > kMaxOutputs) return count < 0 ? fail("outputs", &err) : 0;
  out->count = count;
  for (int o = 0; o < count; ++o) {
    DLManagedTensor* view = NULL;
    if (dsoop_tensor_to_dlpack(tensors[o], &view, &err) != 0) return fail("output", &err);
    dsoop_object_release(tensors[o]);
    const DLTensor* t = &view->dl_tensor;
    out->size[o] = num_elements(t->ndim, t->shape);
    const size_t bytes = (size_t)out->size[o] * sizeof(float);
    out->data[o] = (float*)malloc(bytes);
    const char* src = (const char*)t->data + t->byte_offset;
    if (t->device.device_type != device.device_type) {
      fprintf(stderr, "model_harness: %s: output %d is on device type %d\n", path, o, t->device.device_type);
      return 0;
    }
    if (on_gpu) {
      if (!check(cu.memcpy_dtoh_async(out->data[o], (CUdeviceptr)(uintptr_t)src, bytes, stream), "copy out")) {
        return 0;
      }
    } else {
      memcpy(out->data[o], src, bytes);
    }
    // The copy out is queued on the stream that TVM's pooled memory is reused
    // on, so the view may go now.
    view->deleter(view);
  }
  if (on_gpu && !check(cu.stream_synchronize(stream), "synchronize")) return 0;
  // Time a call (on the GPU: queued and finished).
  const double start = now_us();
  for (int c = 0; c < kTimedCalls; ++c) {
    if (dsoop_vm_call(pool, index, args, m->num_inputs, stream, &result, &err) != 0) {
      return fail(m->function, &err);
    }
    dsoop_any_release(&result);
  }
  if (on_gpu && !check(cu.stream_synchronize(stream), "synchronize")) return 0;
  *us = (now_us() - start) / kTimedCalls;
  for (int i = 0; i < m->num_inputs; ++i) dsoop_object_release(args[i].v_obj);
  dsoop_vm_pool_destroy(pool);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr,
            "usage: model_harness LIBTVM_FFI.so LIBTVM_RUNTIME.so LIBCUDART.so "
            "LIBTVM_RUNTIME_CUDA.so MODELS_DIR\n");
    return kFailed;
  }
  CUdevice device;
  int driver_version = 0;
  const int started = start_cuda("model_harness", &device, &driver_version);
  if (started != kPassed) return started;
  DsoopError err = {NULL, NULL};
  // TVM's runtime (the VM), the CUDA runtime it links, and TVM's CUDA runtime,
  // which loads the models' GPU code: opened as the op opens them.
  if (dsoop_runtime_init(argv[1], argv[2], &err) != 0 || dsoop_load_extension(argv[3], &err) != 0 ||
      dsoop_load_extension(argv[4], &err) != 0) {
    fail("TVM runtime", &err);
    return kFailed;
  }
  CUstream stream;
  if (!check(cu.stream_create(&stream, kNonBlocking), "stream")) return kFailed;
  int all_match = 1;
  for (size_t k = 0; k < sizeof(kModels) / sizeof(kModels[0]); ++k) {
    const Model* m = &kModels[k];
    float* inputs[kMaxInputs];
    for (int i = 0; i < m->num_inputs; ++i) {
      const int64_t n = num_elements(m->ndim[i], m->shape[i]);
      inputs[i] = (float*)malloc((size_t)n * sizeof(float));
      for (int64_t j = 0; j < n; ++j) inputs[i][j] = (float)sin(0.37 * (double)j + i) / 2;
    }
    char cpu_path[4096], gpu_path[4096];
    snprintf(cpu_path, sizeof(cpu_path), "%s/%s.so", argv[5], m->stem);
    snprintf(gpu_path, sizeof(gpu_path), "%s/%s_cuda.so", argv[5], m->stem);
    Outputs cpu = {0}, gpu = {0};
    double cpu_us = 0, gpu_us = 0;
    const DLDevice host = {kDLCPU, 0}, cuda = {kDLCUDA, 0};
    if (!run(m, cpu_path, host, NULL, inputs, &cpu, &cpu_us) ||
        !run(m, gpu_path, cuda, stream, inputs, &gpu, &gpu_us)) {
      return kFailed;
    }
    double worst = 0;
    int same_shape = cpu.count == gpu.count;
    for (int o = 0; same_shape && o < cpu.count; ++o) {
      same_shape = cpu.size[o] == gpu.size[o];
      for (int64_t j = 0; same_shape && j < cpu.size[o]; ++j) {
        worst = fmax(worst, fabs((double)cpu.data[o][j] - (double)gpu.data[o][j]));
      }
    }
    const int match = same_shape && worst <= kTolerance;
    printf("%s.%s: %d output(s), CUDA vs CPU max |diff| %.2e (%s); %.1f us a call on the GPU, %.1f on the CPU\n",
           m->stem, m->function, gpu.count, worst, match ? "match" : "MISMATCH", gpu_us, cpu_us);
    all_match &= match;
    free_outputs(&cpu);
    free_outputs(&gpu);
    for (int i = 0; i < m->num_inputs; ++i) free(inputs[i]);
  }
  return all_match ? kPassed : kFailed;
}
