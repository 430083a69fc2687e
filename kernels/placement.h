// placement.h: where a kernel's buffers live and how it reaches them, one class
// a device kind, made per Compute: CpuPlacement (the host) and GpuPlacement (a
// CUDA GPU, through TF's stream for the op). The call path (call.h) is a
// template over them.
#ifndef TVMDSOOP_KERNELS_PLACEMENT_H_
#define TVMDSOOP_KERNELS_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "dsoop/dsoop.h"
#include "kernels/aligned_buffer.h"
#include "kernels/output_pool.h"
#include "kernels/tf_compat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"

namespace tvmdsoop {
namespace internal {
// Internal linkage, a copy in each file that includes this (call.h says why).
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Where a kernel's buffers live and how it reaches them: the host. Made per
// Compute; scratch memory lives until it is destroyed, after the call.
class CpuPlacement {
 public:
  Status Init(OpKernelContext*) { return Status(); }
  DLDevice dl_device() const { return {kDLCPU, 0}; }

  // Output o of shape, for the function to write: from the kernel's pool when
  // it serves the size (OutputPool), else from TF.
  Status AllocateOutput(OpKernelContext* ctx, int o, const TensorShape& shape,
                        const std::shared_ptr<OutputPool>& pool, Tensor** out) {
    const DataType dtype = ctx->expected_output_dtype(o);
    const auto elements = static_cast<size_t>(shape.num_elements());
    const auto element_size = static_cast<size_t>(tensorflow::DataTypeSize(dtype));
    // TF allocates outputs with allocator attributes (pinned memory for a copy
    // to a GPU, a scoped allocator), mid-sized ones, and ones too large for
    // size_t (its allocator says so in its own words).
    if (ctx->output_alloc_attr(o).value != 0 || element_size == 0 || elements > SIZE_MAX / element_size ||
        !pool->Serves(elements * element_size)) {
      return ctx->allocate_output(o, shape, out);
    }
    const size_t bytes = elements * element_size;
    char* data = pool->Take(bytes);
    if (data == nullptr) return errors::ResourceExhausted("cannot allocate ", bytes, " bytes");
    // The tensor takes the buffer's one reference.
    ctx->set_output(o, Tensor(dtype, shape, tensorflow::core::RefCountPtr<tensorflow::TensorBuffer>(
                                                new PooledBuffer(pool, data, bytes))));
    *out = ctx->mutable_output(o);
    return Status();
  }

  // size bytes aligned to alignment, for a buffer TF gave us below it.
  Status Scratch(OpKernelContext*, size_t size, int64_t alignment, char** out) {
    AlignedBuffer buffer;
    TF_RETURN_IF_ERROR(AllocateAligned(size, alignment, &buffer));
    *out = buffer.get();
    scratch_.push_back(std::move(buffer));
    return Status();
  }

  Status Copy(char* dst, const char* src, size_t size) {
    std::memcpy(dst, src, size);
    return Status();
  }

  // Host memory is the device's: the same copy.
  Status CopyFromHost(char* dst, const char* src, size_t size) { return Copy(dst, src, size); }

  // Calls fn, leaving what it returned in *result.
  int Call(const DsoopFunction& fn, const TVMFFIAny* args, int num_args, TVMFFIAny* result,
           DsoopError* err) {
    return dsoop_call(&fn, args, num_args, result, err);
  }

  void* stream() const { return nullptr; }

 private:
  absl::InlinedVector<AlignedBuffer, 2> scratch_;
};

// A CUDA GPU, and TF's stream for this op there. Everything is queued on that
// stream: TVM's kernels (TVM's current stream is set to it for the call) and the
// copies through scratch, so the op is ordered with TF's other work on the device
// without a synchronisation. (TF creates its streams non-blocking: work on CUDA's
// legacy default stream would not be ordered with them.)
class GpuPlacement {
 public:
  Status Init(OpKernelContext* ctx) {
    tensorflow::DeviceContext* device_context = ctx->op_device_context();
    stream_ = device_context == nullptr ? nullptr : device_context->stream();
    if (stream_ == nullptr) {
      return errors::Internal("TVMDSOOp: the GPU kernel has no stream from TensorFlow");
    }
    handle_ = stream_->platform_specific_handle().stream;
    if (handle_ == nullptr) {
      // TVM would fall back to the legacy default stream: the race this kernel avoids.
      return errors::Internal("TVMDSOOp: TensorFlow's GPU stream has no CUDA stream handle");
    }
    // The CUDA ordinal of TF's device: its platform device id, by which TF numbers
    // the stream's executor too. (Read here rather than from the executor, whose
    // header in the TF 2.19 wheel includes LLVM headers the wheel does not ship.)
    const auto* info = ctx->device()->tensorflow_accelerator_device_info();
    if (info == nullptr) {
      return errors::Internal("TVMDSOOp: the GPU kernel's device has no accelerator info");
    }
    device_id_ = info->gpu_id;
    return Status();
  }

  DLDevice dl_device() const { return {kDLCUDA, device_id_}; }

  // Output o of shape, from TF (its GPU allocator keeps and reuses memory).
  Status AllocateOutput(OpKernelContext* ctx, int o, const TensorShape& shape,
                        const std::shared_ptr<OutputPool>&, Tensor** out) {
    return ctx->allocate_output(o, shape, out);
  }

  // Device memory from TF's allocator, aligned within a slightly larger block.
  // Freeing it when Compute ends is safe: TF's GPU allocator orders reuse of
  // memory on the stream the work was queued on.
  Status Scratch(OpKernelContext* ctx, size_t size, int64_t alignment, char** out) {
    Tensor block;
    TF_RETURN_IF_ERROR(AlignedTemp(ctx, size, alignment, &block, out));
    scratch_.push_back(std::move(block));
    return Status();
  }

  Status Copy(char* dst, const char* src, size_t size) {
    tf_compat::DeviceAddress to(dst, size);
    return stream_->MemcpyD2D(&to, tf_compat::DeviceAddress(const_cast<char*>(src), size), size);
  }

  // Host memory a returned tensor lives in (a model's shape outputs, say), copied
  // to the device. The host side is TVM's and is freed when the caller drops it,
  // so the copy is waited for.
  Status CopyFromHost(char* dst, const char* src, size_t size) {
    tf_compat::DeviceAddress to(dst, size);
    TF_RETURN_IF_ERROR(stream_->Memcpy(&to, src, size));
    return stream_->BlockHostUntilDone();
  }

  // Calls fn on TF's stream (TVM's current stream for the device for the call),
  // leaving what it returned in *result.
  int Call(const DsoopFunction& fn, const TVMFFIAny* args, int num_args, TVMFFIAny* result,
           DsoopError* err) {
    return dsoop_function_call_returning(&fn, args, num_args, kDLCUDA, device_id_, handle_, result,
                                         err);
  }

  void* stream() const { return handle_; }

 private:
  stream_executor::Stream* stream_ = nullptr;
  void* handle_ = nullptr;  // the CUstream
  int32_t device_id_ = 0;
  absl::InlinedVector<Tensor, 2> scratch_;
};

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_PLACEMENT_H_
