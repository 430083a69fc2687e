// tvm_add_one.so: TVM's generated add_one for CUDA (kernel and host wrapper,
// tvm_add_one.cu from tests/gpu/tvm_add_one.py), plus a raw launch of the same
// kernel for the harness to measure our launch path against.
#include "tvm_add_one.cu"

// Launches TVM's add_one kernel on `stream` exactly as TVM's host code does (256
// threads a block, 4 elements a thread: THREADS and PER_THREAD of
// tvm_add_one.py), with none of the argument checks or stream look-up. Returns
// the cudaError_t of the launch.
extern "C" __attribute__((visibility("default"))) int raw_add_one(float* x, float* y, int n,
                                                                  void* stream) {
  void* args[] = {&x, &y, &n};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(add_one_kernel),
                                           dim3((n + 1023) / 1024), dim3(256), args, 0,
                                           static_cast<cudaStream_t>(stream)));
}
