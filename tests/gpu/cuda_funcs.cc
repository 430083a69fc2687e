// A tvm-ffi CUDA library for the GPU harness, built with a plain C++ compiler:
// its kernels are PTX, JIT-compiled by the CUDA driver (loaded at run time), so
// neither the CUDA toolkit nor NVRTC is needed to build it. Like TVM's generated
// CUDA code, every function launches on the stream TVM says is current for the
// device (TVMFFIEnvGetStream): the stream the caller set.
//
//   add_one(x: float32[n] on CUDA, y: float32[n] on CUDA)      y = x + 1
//   slow_fill(y: float32[n] on CUDA, value: float, cycles: int) spins, then y = value
#include <dlfcn.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <mutex>

namespace {

using tvm::ffi::TensorView;

// The few CUDA driver API entry points used, resolved from libcuda.so.1.
using CUresult = int;
using CUdevice = int;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;

struct Driver {
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**);
  CUfunction add_one = nullptr;
  CUfunction slow_fill = nullptr;
};

constexpr const char kPtx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry add_one(.param .u64 x, .param .u64 y, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<8>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd3, %rd1;
  cvta.to.global.u64 %rd4, %rd2;
  mul.wide.u32 %rd5, %r5, 4;
  add.s64 %rd6, %rd3, %rd5;
  add.s64 %rd7, %rd4, %rd5;
  ld.global.f32 %f1, [%rd6];
  add.f32 %f2, %f1, 0f3F800000;
  st.global.f32 [%rd7], %f2;
DONE:
  ret;
}

.visible .entry slow_fill(.param .u64 y, .param .u32 n, .param .u64 cycles, .param .f32 value)
{
  .reg .pred %p<3>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<9>;
  .reg .f32 %f<2>;
  ld.param.u64 %rd1, [y];
  ld.param.u32 %r1, [n];
  ld.param.u64 %rd2, [cycles];
  ld.param.f32 %f1, [value];
  mov.u64 %rd3, %clock64;
SPIN:
  mov.u64 %rd4, %clock64;
  sub.s64 %rd5, %rd4, %rd3;
  setp.lt.s64 %p1, %rd5, %rd2;
  @%p1 bra SPIN;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p2, %r5, %r1;
  @%p2 bra DONE;
  cvta.to.global.u64 %rd6, %rd1;
  mul.wide.u32 %rd7, %r5, 4;
  add.s64 %rd8, %rd6, %rd7;
  st.global.f32 [%rd8], %f1;
DONE:
  ret;
}
)ptx";

#define CUDA_CHECK(call, what)                                          \
  do {                                                                  \
    CUresult rc = (call);                                               \
    if (rc != 0) TVM_FFI_THROW(RuntimeError) << what << " failed: CUDA error " << rc; \
  } while (0)

// Loads the driver and the PTX once, in the caller's current CUDA context.
Driver& GetDriver() {
  static Driver driver;
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return;
    *reinterpret_cast<void**>(&driver.module_load_data) = dlsym(lib, "cuModuleLoadData");
    *reinterpret_cast<void**>(&driver.module_get_function) = dlsym(lib, "cuModuleGetFunction");
    *reinterpret_cast<void**>(&driver.launch_kernel) = dlsym(lib, "cuLaunchKernel");
    CUmodule module = nullptr;
    if (driver.module_load_data == nullptr || driver.module_load_data(&module, kPtx) != 0) return;
    if (driver.module_get_function(&driver.add_one, module, "add_one") != 0) return;
    if (driver.module_get_function(&driver.slow_fill, module, "slow_fill") != 0) return;
    ok = true;
  });
  if (!ok) TVM_FFI_THROW(RuntimeError) << "cannot load libcuda.so.1 or the PTX kernels";
  return driver;
}

void CheckCudaFloat(const TensorView& t, const char* name) {
  if (t.device().device_type != kDLCUDA) TVM_FFI_THROW(ValueError) << name << " must be on CUDA";
  if (t.dtype().code != kDLFloat || t.dtype().bits != 32 || t.ndim() != 1) {
    TVM_FFI_THROW(TypeError) << name << " must be a float32 vector";
  }
}

// Launches kernel over n elements (256 threads a block) on TVM's current stream
// for the device of `on`.
void Launch(CUfunction kernel, const char* name, unsigned n, const TensorView& on, void** params) {
  CUstream stream = TVMFFIEnvGetStream(kDLCUDA, on.device().device_id);
  CUDA_CHECK(GetDriver().launch_kernel(kernel, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, params,
                                       nullptr),
             "launching " << name);
}

void AddOne(TensorView x, TensorView y) {
  CheckCudaFloat(x, "x");
  CheckCudaFloat(y, "y");
  if (x.size(0) != y.size(0)) TVM_FFI_THROW(ValueError) << "x and y differ in length";
  void* x_ptr = x.data_ptr();
  void* y_ptr = y.data_ptr();
  unsigned n = static_cast<unsigned>(x.size(0));
  void* params[] = {&x_ptr, &y_ptr, &n};
  Launch(GetDriver().add_one, "add_one", n, x, params);
}

void SlowFill(TensorView y, double value, int64_t cycles) {
  CheckCudaFloat(y, "y");
  void* y_ptr = y.data_ptr();
  unsigned n = static_cast<unsigned>(y.size(0));
  unsigned long long spin = static_cast<unsigned long long>(cycles);
  float v = static_cast<float>(value);
  void* params[] = {&y_ptr, &n, &spin, &v};
  Launch(GetDriver().slow_fill, "slow_fill", n, y, params);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_one, AddOne);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(slow_fill, SlowFill);
