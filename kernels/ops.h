// ops.h: what the op definitions (ops.cc) share with the kernels: how the
// attrs read alike in a shape function and in a kernel.
#ifndef TVMDSOOP_KERNELS_OPS_H_
#define TVMDSOOP_KERNELS_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tvmdsoop {
// Hidden from the op library's dynamic symbols: nothing here is its interface.
namespace internal __attribute__((visibility("hidden"))) {

// The -1 dimensions of output_shapes, one output_dims value each: the shape
// function and the kernel count them alike.
int64_t NumDynamicDims(absl::Span<const ::tensorflow::PartialTensorShape> shapes);

}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_OPS_H_
