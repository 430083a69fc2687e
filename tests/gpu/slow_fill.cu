// slow_fill: the long-running kernel of the GPU harness's ordering check, as a
// tvm-ffi CUDA library, built with nvcc (docs/gpu.md).
//
//   slow_fill(y: float32[n] on CUDA, value: float, nanoseconds: int)
//
// Spins for `nanoseconds` of GPU time, then writes `value` into all of y. Like
// TVM's generated code, it launches on the stream TVM says is current for the
// device (TVMFFIEnvGetStream): the stream the caller set.
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>

#include <cstdint>

namespace {

__device__ uint64_t GlobalTimer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// One block: every thread waits out the same interval, then fills its share.
__global__ void SlowFillKernel(float* y, int64_t n, float value, uint64_t nanoseconds) {
  const uint64_t start = GlobalTimer();
  while (GlobalTimer() - start < nanoseconds) {
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = value;
}

void SlowFill(tvm::ffi::TensorView y, double value, int64_t nanoseconds) {
  if (y.device().device_type != kDLCUDA) {
    TVM_FFI_THROW(ValueError) << "slow_fill: y must be on CUDA";
  }
  if (y.dtype().code != kDLFloat || y.dtype().bits != 32 || y.ndim() != 1) {
    TVM_FFI_THROW(TypeError) << "slow_fill: y must be a float32 vector";
  }
  const int device = y.device().device_id;
  tvm::ffi::CUDADeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  SlowFillKernel<<<1, 1024, 0, stream>>>(static_cast<float*>(y.data_ptr()), y.size(0),
                                         static_cast<float>(value),
                                         static_cast<uint64_t>(nanoseconds));
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << "slow_fill: launch failed: " << cudaGetErrorString(rc);
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(slow_fill, SlowFill);
