// returned_output.h: what a function that returns its outputs gave back, made
// the op's outputs: checked against what the op declares (all of them first),
// then taken without a copy where TF can take the memory (ReturnedBuffer), else
// copied.
#ifndef TVMDSOOP_KERNELS_RETURNED_OUTPUT_H_
#define TVMDSOOP_KERNELS_RETURNED_OUTPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "dsoop/dsoop.h"
#include "kernels/aligned_buffer.h"
#include "kernels/dlpack_tensor.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tvmdsoop {
namespace internal {
// Internal linkage, a copy in each file that includes this (call.h says why).
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// The alignment TF requires of a tensor's buffer (EIGEN_MAX_ALIGN_BYTES in its
// builds): memory TVM returns is taken as it is only when it has it.
inline constexpr int64_t kTFAlignment = 64;

// A TF buffer over memory a function returned, without a copy. It holds TVM's
// DLPack view of the memory, given back when TF drops the buffer. It does not
// claim the memory (OwnsMemory), so TF never hands it to an op that writes its
// output in place: the memory may be an input's, a constant of the model, or
// the VM's pooled memory.
class ReturnedBuffer : public tensorflow::TensorBuffer {
 public:
  ReturnedBuffer(ManagedPtr managed, size_t size)
      : TensorBuffer(static_cast<char*>(managed->dl_tensor.data) + managed->dl_tensor.byte_offset),
        managed_(std::move(managed)),
        size_(size) {}

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("tvm");
  }
  bool OwnsMemory() const override { return false; }

 private:
  ManagedPtr managed_;
  size_t size_;
};

// Checks what a function returned for output i against what is declared (its
// dtype, the known dimensions) and gives its shape: the op's check, and the
// eager entry's (eager_call.cc), which has no kernel context.
inline Status CheckDeclaredOutput(const std::string& where, int i, const DLTensor& dl, DataType dtype,
                                  const PartialTensorShape& declared, TensorShape* shape) {
  DLDataType want;
  if (!ToDLDataType(dtype, &want)) {
    return errors::InvalidArgument(where, ": output ", i, " is declared ",
                                   tensorflow::DataTypeString(dtype), ", which DLPack cannot describe");
  }
  if (dl.dtype.code != want.code || dl.dtype.bits != want.bits || dl.dtype.lanes != want.lanes) {
    return errors::InvalidArgument(where, ": output ", i, " is ", DLTypeName(dl.dtype),
                                   ", but the op declares ", tensorflow::DataTypeString(dtype));
  }
  for (int d = 0; d < dl.ndim; ++d) {
    TF_RETURN_IF_ERROR(shape->AddDimWithStatus(dl.shape[d]));
  }
  if (!declared.IsCompatibleWith(*shape)) {
    return errors::InvalidArgument(where, ": output ", i, " has shape ", shape->DebugString(),
                                   ", but the op declares ", declared.DebugString());
  }
  return Status();
}

// Checks what a function returned for output i against what the op declares
// (CheckDeclaredOutput) and what the op can take (a compact tensor, on the op's
// device or the host), and gives its shape. It sets nothing: every output is
// checked before the first is set (SetReturnedOutput), so that a call that
// fails here leaves the op's outputs unset.
template <typename Placement>
inline Status CheckReturnedOutput(OpKernelContext* ctx, const Placement& placement, const std::string& where,
                                  int i, const DLTensor& dl, const PartialTensorShape& declared,
                                  TensorShape* shape) {
  TF_RETURN_IF_ERROR(CheckDeclaredOutput(where, i, dl, ctx->expected_output_dtype(i), declared, shape));
  if (!IsCompact(dl)) {
    return errors::InvalidArgument(where, ": output ", i,
                                   " is a strided view; the op takes compact tensors only");
  }
  const DLDevice device = placement.dl_device();
  const bool same_device =
      dl.device.device_type == device.device_type && dl.device.device_id == device.device_id;
  if (!same_device && dl.device.device_type != kDLCPU) {
    return errors::Internal(where, ": output ", i, " is on device type ", dl.device.device_type,
                            " ", dl.device.device_id, "; the op runs on device type ",
                            device.device_type, " ", device.device_id);
  }
  return Status();
}

// Makes what a function returned output i, once CheckReturnedOutput has passed
// it as of `shape`: taken as it is, or copied where TF cannot take it (below
// TF's alignment, or on the host for an op on a GPU). It fails only where TF
// cannot allocate the copy, or the copy fails.
template <typename Placement>
inline Status SetReturnedOutput(OpKernelContext* ctx, Placement& placement, int i, ManagedPtr returned,
                                const TensorShape& shape) {
  const DLTensor& dl = returned->dl_tensor;
  const DataType dtype = ctx->expected_output_dtype(i);
  const DLDevice device = placement.dl_device();
  const bool same_device =
      dl.device.device_type == device.device_type && dl.device.device_id == device.device_id;
  const size_t bytes = static_cast<size_t>(shape.num_elements()) * tensorflow::DataTypeSize(dtype);
  const char* data = static_cast<const char*>(dl.data) + dl.byte_offset;
  if (bytes > 0 && same_device && IsAligned(data, kTFAlignment)) {
    auto* buffer = new ReturnedBuffer(std::move(returned), bytes);
    Tensor out(dtype, shape, buffer);
    buffer->Unref();  // the tensor holds its own reference
    ctx->set_output(i, out);
    return Status();
  }
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &out));
  if (bytes == 0) return Status();
  char* dst = const_cast<char*>(out->tensor_data().data());
  if (same_device) return placement.Copy(dst, data, bytes);
  return placement.CopyFromHost(dst, data, bytes);  // CheckReturnedOutput passed only the host else
}

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_RETURNED_OUTPUT_H_
