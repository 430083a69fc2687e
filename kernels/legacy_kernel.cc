// legacy_kernel.cc: the kernel of TvmDsoOp (LegacyTvmDsoOpKernel), the op of
// TVM 0.7-0.19's tvm.contrib.tf_op, and its CPU and GPU registrations. It calls
// plain functions only, through CallKernel (call.h).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/call.h"
#include "kernels/placement.h"
#include "kernels/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using internal::CallKernel;
using internal::CpuPlacement;
using internal::GpuPlacement;
using internal::Resolved;
namespace errors = ::tensorflow::errors;

// TvmDsoOp, the op of TVM 0.7-0.19's tvm.contrib.tf_op, kept so that graphs it
// wrote run unchanged: the output shape is the static attr when there is one, else
// the `dynamic_output_shape` input when it is a vector, else the first input's.
template <typename Placement>
class LegacyTvmDsoOpKernel : public CallKernel {
 public:
  explicit LegacyTvmDsoOpKernel(OpKernelConstruction* ctx) : CallKernel(ctx) {
    std::string lib_path;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lib_path", &lib_path));
    SetArguments(num_inputs() - 1);  // the last input is dynamic_output_shape
    // Resolved for the CPU: it is only a plain function's, on every device.
    OP_REQUIRES_OK(ctx, FunctionFor(lib_path, "", {kDLCPU, 0}, /*allow_models=*/false, &fn_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("has_static_output_shape", &has_static_output_shape_));
    std::vector<int64_t> dims;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("static_output_shape", &dims));
    for (int64_t d : dims) {
      OP_REQUIRES(ctx, d >= 0,
                  errors::InvalidArgument(Where(lib_path), ": static_output_shape has size ", d));
      const Status added = static_output_shape_.AddDimWithStatus(d);
      OP_REQUIRES(ctx, added.ok(),
                  errors::InvalidArgument(Where(lib_path), ": static_output_shape: ",
                                          added.message()));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_in = num_in_;
    const Tensor& dynamic = ctx->input(num_in);
    TensorShape shape;
    if (has_static_output_shape_) {
      shape = static_output_shape_;
    } else if (dynamic.dims() == 1) {
      for (int64_t d : absl::MakeConstSpan(dynamic.flat<int64_t>().data(), dynamic.NumElements())) {
        CALL_REQUIRES(ctx, d >= 0,
                      errors::InvalidArgument(fn_->where, ": dynamic_output_shape has size ", d));
        const Status added = shape.AddDimWithStatus(d);
        CALL_REQUIRES(ctx, added.ok(),
                      errors::InvalidArgument(fn_->where, ": dynamic_output_shape: ", added.message()));
      }
    } else {
      CALL_REQUIRES(ctx, num_in > 0,
                    errors::InvalidArgument(fn_->where,
                                            ": no output shape and no input to take it from"));
      shape = ctx->input(0).shape();
    }
    Placement placement;
    OP_REQUIRES_OK(ctx, placement.Init(ctx));
    Call(ctx, placement, *fn_, num_in, {&shape});
  }

 private:
  const Resolved* fn_ = nullptr;  // resolved at construction from the lib_path attr
  bool has_static_output_shape_ = false;
  TensorShape static_output_shape_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TvmDsoOp").Device(tensorflow::DEVICE_CPU),
                        LegacyTvmDsoOpKernel<CpuPlacement>);

// The GPU kernel needs no CUDA toolkit to build (see tvm_dso_op_kernel.cc); the
// output shape stays in host memory.
REGISTER_KERNEL_BUILDER(Name("TvmDsoOp")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("dynamic_output_shape"),
                        LegacyTvmDsoOpKernel<GpuPlacement>);

}  // namespace tvmdsoop
