// aligned_buffer.cc: the out-of-line part of aligned_buffer.h.
#include "kernels/aligned_buffer.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {

Status AlignedTemp(OpKernelContext* ctx, size_t size, int64_t alignment, Tensor* block, char** out) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(size + alignment)}), block));
  const auto base = reinterpret_cast<uintptr_t>(block->tensor_data().data());
  const auto a = static_cast<uintptr_t>(alignment);
  *out = reinterpret_cast<char*>((base + a - 1) / a * a);
  return Status();
}

}  // namespace internal
}  // namespace tvmdsoop
