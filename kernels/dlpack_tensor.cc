// dlpack_tensor.cc: the out-of-line parts of dlpack_tensor.h.
#include "kernels/dlpack_tensor.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {

bool ToDLDataType(DataType dtype, DLDataType* out) {
  switch (dtype) {
    case tensorflow::DT_BOOL: *out = {kDLBool, 8, 1}; return true;
    case tensorflow::DT_INT8: *out = {kDLInt, 8, 1}; return true;
    case tensorflow::DT_INT16: *out = {kDLInt, 16, 1}; return true;
    case tensorflow::DT_INT32: *out = {kDLInt, 32, 1}; return true;
    case tensorflow::DT_INT64: *out = {kDLInt, 64, 1}; return true;
    case tensorflow::DT_UINT8: *out = {kDLUInt, 8, 1}; return true;
    case tensorflow::DT_UINT16: *out = {kDLUInt, 16, 1}; return true;
    case tensorflow::DT_UINT32: *out = {kDLUInt, 32, 1}; return true;
    case tensorflow::DT_UINT64: *out = {kDLUInt, 64, 1}; return true;
    case tensorflow::DT_HALF: *out = {kDLFloat, 16, 1}; return true;
    case tensorflow::DT_BFLOAT16: *out = {kDLBfloat, 16, 1}; return true;
    case tensorflow::DT_FLOAT: *out = {kDLFloat, 32, 1}; return true;
    case tensorflow::DT_DOUBLE: *out = {kDLFloat, 64, 1}; return true;
    case tensorflow::DT_COMPLEX64: *out = {kDLComplex, 64, 1}; return true;
    case tensorflow::DT_COMPLEX128: *out = {kDLComplex, 128, 1}; return true;
    default: return false;
  }
}

bool IsCompact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

}  // namespace internal
}  // namespace tvmdsoop
