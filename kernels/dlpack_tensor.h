// dlpack_tensor.h: TF tensors in DLPack's terms: the DLPack type of a TF dtype,
// a TF tensor lent to TVM as a DLManagedTensor, and the ownership of a DLPack
// view TVM gives back.
#ifndef TVMDSOOP_KERNELS_DLPACK_TENSOR_H_
#define TVMDSOOP_KERNELS_DLPACK_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "dsoop/dsoop.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tvmdsoop {
// Hidden from the op library's dynamic symbols: nothing here is its interface.
namespace internal __attribute__((visibility("hidden"))) {

using ::tensorflow::DataType;
using ::tensorflow::Tensor;

// The DLPack type of a TF dtype; false for dtypes DLPack cannot describe.
bool ToDLDataType(DataType dtype, DLDataType* out);

// The TF dtype of a DLPack type; false for types TF has no dtype of.
bool FromDLDataType(DLDataType type, DataType* out);

// Whether a DLTensor is compact row-major (no strides, or the compact ones).
bool IsCompact(const DLTensor& t);

// Internal linkage, a copy in each file that includes this (call.h says why).
namespace {

// "float32", for error messages.
inline std::string DLTypeName(DLDataType t) {
  static const char* const kNames[] = {"int", "uint", "float", "handle", "bfloat", "complex", "bool"};
  if (t.code == kDLBool) return "bool";
  return absl::StrCat(t.code < 7 ? kNames[t.code] : "code", t.bits);
}

// Gives a DLPack view back to its owner.
struct ManagedDeleter {
  void operator()(DLManagedTensor* m) const {
    if (m->deleter != nullptr) m->deleter(m);
  }
};
using ManagedPtr = std::unique_ptr<DLManagedTensor, ManagedDeleter>;

// A TF tensor lent to TVM as a Tensor object, without a copy. TVM holds it, and
// with it a reference to TF's buffer, until it drops the object: after the call,
// when an output is the input itself.
struct LentTensor {
  DLManagedTensor managed;
  Tensor keep;
  absl::InlinedVector<int64_t, 6> shape;

  static void Delete(DLManagedTensor* self) { delete static_cast<LentTensor*>(self->manager_ctx); }
};

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_DLPACK_TENSOR_H_
