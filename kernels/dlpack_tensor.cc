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

bool FromDLDataType(DLDataType type, DataType* out) {
  using namespace tensorflow;  // NOLINT: the dtypes' names
  for (DataType dtype : {DT_BOOL, DT_INT8, DT_INT16, DT_INT32, DT_INT64, DT_UINT8, DT_UINT16, DT_UINT32, DT_UINT64,
                         DT_HALF, DT_BFLOAT16, DT_FLOAT, DT_DOUBLE, DT_COMPLEX64, DT_COMPLEX128}) {
    DLDataType known;
    if (ToDLDataType(dtype, &known) && known.code == type.code && known.bits == type.bits &&
        known.lanes == type.lanes) {
      *out = dtype;
      return true;
    }
  }
  return false;
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
