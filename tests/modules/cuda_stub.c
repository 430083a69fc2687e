/* Build-time stand-in for the CUDA driver (libcuda.so.1) on a machine without one.
   Defines only the driver symbols libtvm_runtime_cuda.so links against; every call
   fails with CUDA_ERROR_NO_DEVICE (100). Never load this where a real driver exists. */
#define STUB(name) int name() { return 100; }
STUB(cuDeviceGetName) STUB(cuFuncSetAttribute) STUB(cuLaunchKernelEx)
STUB(cuModuleGetFunction) STUB(cuModuleLoadData) STUB(cuModuleUnload)
STUB(cuTensorMapEncodeTiled)
static const char kMsg[] = "CUDA_ERROR_NO_DEVICE (build-time libcuda stub)";
int cuGetErrorName(int e, const char** s) { *s = kMsg; return 0; }
int cuGetErrorString(int e, const char** s) { *s = kMsg; return 0; }
