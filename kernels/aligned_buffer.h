// aligned_buffer.h: memory at the alignment TVM asks for, for the buffers TF
// gave below it: on the host from aligned_alloc (AllocateAligned), on the
// kernel's device inside a temporary TF buffer (AlignedTemp).
#ifndef TVMDSOOP_KERNELS_ALIGNED_BUFFER_H_
#define TVMDSOOP_KERNELS_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tvmdsoop {
// Hidden from the op library's dynamic symbols: nothing here is its interface.
namespace internal __attribute__((visibility("hidden"))) {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// size bytes aligned to alignment inside a temporary TF buffer on the kernel's
// device (*block, which the caller keeps for as long as the bytes are used).
Status AlignedTemp(OpKernelContext* ctx, size_t size, int64_t alignment, Tensor* block, char** out);

// Internal linkage, a copy in each file that includes this (call.h says why).
namespace {

// Memory from aligned_alloc, for buffers TF gave us below the requested alignment.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeDeleter>;

// alignment: a power of two (the attr is checked so), tested with a mask, not a division.
inline bool IsAligned(const void* p, int64_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) & (static_cast<uintptr_t>(alignment) - 1)) == 0;
}

inline Status AllocateAligned(size_t size, int64_t alignment, AlignedBuffer* out) {
  const size_t a = static_cast<size_t>(alignment);
  const size_t rounded = (size + a - 1) / a * a;  // aligned_alloc wants a multiple
  out->reset(static_cast<char*>(std::aligned_alloc(a, rounded == 0 ? a : rounded)));
  if (*out == nullptr) {
    return errors::ResourceExhausted("cannot allocate ", size, " bytes of scratch memory aligned to ",
                                     alignment, " bytes (the buffer TF gave is not so aligned)");
  }
  return Status();
}

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_ALIGNED_BUFFER_H_
