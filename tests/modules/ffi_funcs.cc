// Test functions built with tvm-ffi's C++ export macros, for what TVM's compiler
// cannot produce: complex dtypes, pointer probes, deliberate errors, scalars.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <tvm/ffi/string.h>

#include <tvm/ffi/container/array.h>

#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>

namespace {

using tvm::ffi::TensorView;

int64_t NumElements(const TensorView& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim(); ++i) n *= t.size(i);
  return n;
}

void CheckDtype(const TensorView& t, DLDataTypeCode code, int bits, const char* name) {
  if (t.dtype().code != code || t.dtype().bits != bits) {
    TVM_FFI_THROW(TypeError) << "expected " << name << " tensors";
  }
}

// y = conj(x), for complex64 or complex128.
template <typename T>
void Conj(TensorView x, TensorView y) {
  CheckDtype(x, kDLComplex, 8 * sizeof(std::complex<T>), "complex");
  CheckDtype(y, kDLComplex, 8 * sizeof(std::complex<T>), "complex");
  if (NumElements(x) != NumElements(y)) TVM_FFI_THROW(ValueError) << "x and y differ in size";
  const auto* in = static_cast<const std::complex<T>*>(x.data_ptr());
  auto* out = static_cast<std::complex<T>*>(y.data_ptr());
  for (int64_t i = 0; i < NumElements(x); ++i) out[i] = std::conj(in[i]);
}

// out[0] = the address of x's data, out[1] = the address of out's own data: the
// tests compare them with TensorFlow's buffers to prove no copy was made.
void PointerProbe(TensorView x, TensorView out) {
  CheckDtype(out, kDLInt, 64, "int64");
  if (NumElements(out) != 2) TVM_FFI_THROW(ValueError) << "out must hold 2 elements";
  auto* o = static_cast<int64_t*>(out.data_ptr());
  o[0] = reinterpret_cast<int64_t>(static_cast<char*>(x.data_ptr()) + x.byte_offset());
  o[1] = reinterpret_cast<int64_t>(o);
}

// y = x + 1 (float32), and where = {x's address, y's address}: an element-wise
// function that may write y over x (inplace={0: 0}); the tests see from where
// whether TensorFlow gave it x's buffer for y.
void AddOneNotingBuffers(TensorView x, TensorView y, TensorView where) {
  CheckDtype(x, kDLFloat, 32, "float32");
  CheckDtype(y, kDLFloat, 32, "float32");
  CheckDtype(where, kDLInt, 64, "int64");
  if (NumElements(x) != NumElements(y)) TVM_FFI_THROW(ValueError) << "x and y differ in size";
  if (NumElements(where) != 2) TVM_FFI_THROW(ValueError) << "where must hold 2 elements";
  const auto* in = reinterpret_cast<const float*>(static_cast<char*>(x.data_ptr()) + x.byte_offset());
  auto* out = reinterpret_cast<float*>(static_cast<char*>(y.data_ptr()) + y.byte_offset());
  for (int64_t i = 0; i < NumElements(x); ++i) out[i] = in[i] + 1.0f;
  auto* w = static_cast<int64_t*>(where.data_ptr());
  w[0] = reinterpret_cast<int64_t>(in);
  w[1] = reinterpret_cast<int64_t>(out);
}

// Always fails, the way a TVM function reports a bad argument.
void RaiseValueError(TensorView x, TensorView y) {
  TVM_FFI_THROW(ValueError) << "deliberate failure from raise_value_error";
}

// Always fails with an error kind that is not about the arguments.
void RaiseRuntimeError(TensorView x, TensorView y) {
  TVM_FFI_THROW(RuntimeError) << "deliberate runtime failure";
}

// Scalar arguments and results, for bindings that pass more than tensors.
int64_t AddInt(int64_t a, int64_t b) { return a + b; }
double Scale(double x, double k) { return x * k; }
bool Negate(bool b) { return !b; }
tvm::ffi::String Greet(tvm::ffi::String name) { return "hello, " + std::string(name); }

// x[i] = value for every element of a float32 tensor: a tensor and a scalar.
void Fill(TensorView x, double value) {
  CheckDtype(x, kDLFloat, 32, "float32");
  auto* data = static_cast<float*>(x.data_ptr());
  for (int64_t i = 0; i < NumElements(x); ++i) data[i] = static_cast<float>(value);
}

// out[0] = the stream TVM hands kernels for a device: what a caller set with
// TVMFFIEnvSetStream. Lets CPU-only tests check the stream plumbing of GPU calls.
void CurrentStream(TensorView out, int64_t device_type, int64_t device_id) {
  CheckDtype(out, kDLInt, 64, "int64");
  *static_cast<int64_t*>(out.data_ptr()) = reinterpret_cast<int64_t>(
      TVMFFIEnvGetStream(static_cast<int32_t>(device_type), static_cast<int32_t>(device_id)));
}

// Functions that return their outputs (TVMDSOOp's returns=True).

// x itself: the output aliases the input, which TF must then never write into.
tvm::ffi::Tensor Identity(tvm::ffi::Tensor x) { return x; }

// Host memory 4 bytes past a 64-byte boundary, which TF cannot take as a
// tensor's buffer: the op must copy what lives there.
struct MisalignedAlloc {
  void AllocData(DLTensor* t) {
    size_t bytes = (t->dtype.bits + 7) / 8;
    for (int i = 0; i < t->ndim; ++i) bytes *= static_cast<size_t>(t->shape[i]);
    char* block = static_cast<char*>(std::aligned_alloc(64, (bytes + 4 + 63) / 64 * 64));
    if (block == nullptr) TVM_FFI_THROW(MemoryError) << "out of memory";
    t->data = block + 4;
  }
  void FreeData(DLTensor* t) { std::free(static_cast<char*>(t->data) - 4); }
};

// x + 1 for float32, in memory TF cannot take.
tvm::ffi::Tensor AddOneMisaligned(TensorView x) {
  CheckDtype(x, kDLFloat, 32, "float32");
  tvm::ffi::Tensor y = tvm::ffi::Tensor::FromNDAlloc(MisalignedAlloc(), x.shape(), x.dtype(), x.device());
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* out = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < NumElements(x); ++i) out[i] = in[i] + 1.0f;
  return y;
}

// (x, a new tensor x * 2): a tuple of two.
tvm::ffi::Array<tvm::ffi::Tensor> WithDouble(tvm::ffi::Tensor x) {
  CheckDtype(x, kDLFloat, 32, "float32");
  tvm::ffi::Tensor y = tvm::ffi::Tensor::FromNDAlloc(MisalignedAlloc(), x.shape(), x.dtype(), x.device());
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* out = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < NumElements(x); ++i) out[i] = in[i] * 2.0f;
  return {x, y};
}

}  // namespace

// Runs when the library is loaded: writes the file $TVMDSOOP_TEST_LOAD_MARKER
// names, so tests see whether the library's code ran (a refused library must not).
__attribute__((constructor)) void MarkLoaded() {
  if (const char* path = std::getenv("TVMDSOOP_TEST_LOAD_MARKER")) {
    if (FILE* f = std::fopen(path, "w")) std::fclose(f);
  }
}

// Data under a function's symbol name, as export_library's __tvm_ffi__library_bin
// is: TVM's loader would wrap it as a function, and a call would jump into data.
extern "C" TVM_FFI_DLL_EXPORT const char __tvm_ffi_not_code[64] = "data, not a function";

// Takes an input and an output as a destination-passing function does, but
// returns a number and writes nothing: the op must not drop the number.
int64_t CountInsteadOfWriting(TensorView x, TensorView) { return NumElements(x); }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(count_instead_of_writing, CountInsteadOfWriting);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(identity, Identity);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_one_misaligned, AddOneMisaligned);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(with_double, WithDouble);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(current_stream, CurrentStream);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_int, AddInt);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, Scale);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(negate, Negate);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(greet, Greet);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fill, Fill);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(conj_complex64, Conj<float>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(conj_complex128, Conj<double>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(pointer_probe, PointerProbe);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_one_noting_buffers, AddOneNotingBuffers);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(raise_value_error, RaiseValueError);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(raise_runtime_error, RaiseRuntimeError);
