// tvm_dso_op_kernel.cc: the kernel of TVMDSOOp (TVMDSOOpKernel) and its CPU and
// GPU registrations. Compute reads the op's inputs and decides the outputs'
// shapes; the call itself is CallKernel's (call.h), compiled into this file. The
// function is resolved once per kernel and library, by Go; after that Compute
// runs no Go and takes no lock.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/call.h"
#include "kernels/ops.h"
#include "kernels/placement.h"
#include "kernels/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::DataTypeVector;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using internal::CallKernel;
using internal::CpuPlacement;
using internal::GpuPlacement;
using internal::NumDynamicDims;
using internal::Resolved;
using internal::UninitializedArray;
namespace errors = ::tensorflow::errors;

// TVMDSOOp: inputs `args`; `output_dims`, the values of the output dimensions
// that were not known when the graph was built (-1 in `output_shapes`), in order;
// and `library`, the library's path (a tensor, so that a SavedModel asset can
// give it).
template <typename Placement>
class TVMDSOOpKernel : public CallKernel {
 public:
  explicit TVMDSOOpKernel(OpKernelConstruction* ctx) : CallKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lib_sha256", &lib_sha256_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("graph_sha256", &graph_sha256_));
    OP_REQUIRES(ctx, graph_sha256_.empty() || graph_sha256_.size() == 2,
                errors::InvalidArgument(type_string(), ": function '", func_name(),
                                        "': graph_sha256 holds the digests of a graph JSON and its "
                                        "params, or none; got ", graph_sha256_.size()));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("returns", &returns_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("alignment", &alignment_));
    OP_REQUIRES(ctx, alignment_ > 0 && (alignment_ & (alignment_ - 1)) == 0,
                errors::InvalidArgument(type_string(), ": function '", func_name(),
                                        "': alignment must be a power of two, got ",
                                        alignment_));
    const Status shapes_read = ctx->GetAttr("output_shapes", &output_shapes_);
    OP_REQUIRES(ctx, shapes_read.ok(),
                errors::InvalidArgument(type_string(), ": function '", func_name(), "': output_shapes: ",
                                        shapes_read.message()));
    OP_REQUIRES(ctx, static_cast<int>(output_shapes_.size()) == num_outputs(),
                errors::InvalidArgument(type_string(), ": function '", func_name(), "': ",
                                        output_shapes_.size(),
                                        " output shapes for ", num_outputs(), " output dtypes"));
    num_dynamic_dims_ = static_cast<int>(NumDynamicDims(output_shapes_));
    for (const PartialTensorShape& s : output_shapes_) {
      // A fully known shape is made once here, not on every call.
      OutputShape planned;
      if (s.AsTensorShape(&planned.known)) {
        planned.kind = OutputShape::kKnown;
      } else {
        planned.kind = s.unknown_rank() ? OutputShape::kFirstInput : OutputShape::kCompleted;
      }
      output_plan_.push_back(planned);
    }
    // The inputs: the function's (Tin), then output_dims_parts tensors of output
    // sizes (one in graphs written before the attr was added), then library.
    DataTypeVector arg_types;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tin", &arg_types));
    SetArguments(static_cast<int>(arg_types.size()));
    num_dims_parts_ = num_inputs() - num_in_ - 1;
    first_input_shapes_ =
        num_in_ > 0 && std::all_of(output_plan_.begin(), output_plan_.end(), [](const OutputShape& s) {
          return s.kind == OutputShape::kFirstInput;
        });
    OP_REQUIRES_OK(ctx, ReadInplace(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_in = num_in_;
    // A vector names the libraries of the function's gradient after its own:
    // they ride along so that SavedModels carry them; only the first is called.
    const Tensor& library = ctx->input(num_in + num_dims_parts_);
    CALL_REQUIRES(ctx, library.dims() == 0 || (library.dims() == 1 && library.NumElements() > 0),
                  errors::InvalidArgument(type_string(), ": function '", func_name(),
                                          "': library must be a scalar string (or a vector whose "
                                          "first element is the library), got shape ",
                                          library.shape().DebugString()));
    // The op's def makes library a string tensor: its first element, without
    // flat<>()'s dtype check (a call into TF on every run).
    const tensorflow::tstring& lib_path = *static_cast<const tensorflow::tstring*>(library.data());
    Placement placement;
    OP_REQUIRES_OK(ctx, placement.Init(ctx));
    const Resolved* fn = nullptr;
    if (ABSL_PREDICT_FALSE(!graph_sha256_.empty())) {
      OP_REQUIRES_OK(ctx, GraphFunction(ctx, library, placement.dl_device(), &fn));
    } else {
      OP_REQUIRES_OK(ctx, FunctionFor(absl::string_view(lib_path.data(), lib_path.size()),
                                      lib_sha256_, placement.dl_device(), /*allow_models=*/true, &fn));
    }
    const std::string& where = fn->where;
    // The run-time output sizes: output_dims' tensors (scalars or vectors), concatenated.
    absl::InlinedVector<int64_t, 8> dim_values;
    for (int k = 0; k < num_dims_parts_; ++k) {
      const Tensor& part = ctx->input(num_in + k);
      CALL_REQUIRES(ctx, part.dims() <= 1,
                    errors::InvalidArgument(where, ": output_dims ", k,
                                            " must be a scalar or a vector, got shape ",
                                            part.shape().DebugString()));
      const auto values = part.flat<int64_t>();
      dim_values.insert(dim_values.end(), values.data(), values.data() + values.size());
    }
    if (fn->is_model() || returns_) {
      CALL_REQUIRES(ctx, !has_inplace_,
                    errors::InvalidArgument(where, ": returns its outputs, so no output can be "
                                            "written over an input (inplace must name no input)"));
      // Sizes a returning function's outputs have are what it returns: there
      // are none to give, and a -1 in output_shapes is a dimension not checked.
      CALL_REQUIRES(ctx, dim_values.empty(),
                    errors::InvalidArgument(where, ": returns its outputs, so output_dims must be "
                                            "empty, got ", dim_values.size(), " value(s)"));
      CallReturning(ctx, placement, *fn, num_in, output_shapes_);
      return;
    }
    CALL_REQUIRES(ctx, dim_values.size() == static_cast<size_t>(num_dynamic_dims_),
                  errors::InvalidArgument(where, ": output_dims holds ", dim_values.size(),
                                          " values for ", num_dynamic_dims_,
                                          " dynamic output dimensions"));
    if (first_input_shapes_) {  // Module.func's default: no shape to make
      Call(ctx, placement, *fn, num_in, {});
      return;
    }
    // Each output's shape: known since construction, input 0's (nullptr), or
    // completed from output_dims (into `completed`, sized first: shapes point into it).
    const int num_out = num_outputs_of_function();
    UninitializedArray<const TensorShape*, 4> shapes(num_out);
    absl::InlinedVector<TensorShape, 2> completed;
    if (num_dynamic_dims_ > 0) completed.resize(num_out);
    int next_dynamic = 0;
    for (int i = 0; i < num_out; ++i) {
      const OutputShape& planned = output_plan_[i];
      if (planned.kind == OutputShape::kKnown) {
        shapes[i] = &planned.known;
      } else if (planned.kind == OutputShape::kFirstInput) {
        CALL_REQUIRES(ctx, num_in > 0,
                      errors::InvalidArgument(where, ": output ", i,
                                              " takes the first input's shape, but there is no input"));
        shapes[i] = nullptr;
      } else {
        const PartialTensorShape& declared = output_shapes_[i];
        for (int d = 0; d < declared.dims(); ++d) {
          int64_t size = declared.dim_size(d);
          if (size < 0) size = dim_values[next_dynamic++];
          CALL_REQUIRES(ctx, size >= 0,
                        errors::InvalidArgument(where, ": output ", i, " dimension ", d, " is ", size,
                                                "; sizes must be >= 0"));
          const Status added = completed[i].AddDimWithStatus(size);
          CALL_REQUIRES(ctx, added.ok(),
                        errors::InvalidArgument(where, ": output ", i, ": ", added.message()));
        }
        shapes[i] = &completed[i];
      }
    }
    Call(ctx, placement, *fn, num_in, absl::MakeConstSpan(shapes.data(), num_out));
  }

 private:
  // Reads the inplace attr: empty, or one entry per output, each -1 or an
  // input of the output's dtype.
  Status ReadInplace(OpKernelConstruction* ctx) {
    std::vector<int32_t> inplace;
    TF_RETURN_IF_ERROR(ctx->GetAttr("inplace", &inplace));
    if (inplace.empty()) return Status();
    const std::string where = absl::StrCat(type_string(), ": function '", func_name(), "': inplace");
    if (returns_) {
      return errors::InvalidArgument(where, ": the function returns its outputs (returns=True), so "
                                     "no output can be written over an input");
    }
    if (static_cast<int>(inplace.size()) != num_outputs()) {
      return errors::InvalidArgument(where, " has ", inplace.size(), " entries for ",
                                     num_outputs(), " outputs");
    }
    for (int o = 0; o < num_outputs(); ++o) {
      const int i = inplace[o];
      if (i == -1) continue;
      if (i < 0 || i >= num_in_) {
        return errors::InvalidArgument(where, ": output ", o, " names input ", i,
                                       ", but the op has ", num_in_, " input(s)");
      }
      if (i > std::numeric_limits<int16_t>::max()) {
        return errors::InvalidArgument(where, ": output ", o, " names input ", i,
                                       "; only inputs up to ", std::numeric_limits<int16_t>::max(),
                                       " can be written over");
      }
      if (input_type(i) != output_type(o)) {
        return errors::InvalidArgument(where, ": output ", o, " (",
                                       tensorflow::DataTypeString(output_type(o)),
                                       ") cannot be written over input ", i, " (",
                                       tensorflow::DataTypeString(input_type(i)), ")");
      }
      SetReuse(o, i);
    }
    return Status();
  }

  // How a call finds an output's shape, decided from output_shapes once.
  struct OutputShape {
    enum Kind : uint8_t { kKnown, kFirstInput, kCompleted } kind = kCompleted;
    TensorShape known;  // kKnown: the whole shape; kCompleted: from output_dims
  };

  // Read by every call (see CallKernel's members); the rest after them.
  bool returns_ = false;      // a plain function that returns its outputs
  // Every output has input 0's shape (and there is one): the default of an
  // element-wise function, found without reading output_plan_'s line.
  bool first_input_shapes_ = false;
  int num_dims_parts_ = 1;    // output_dims' tensors
  int num_dynamic_dims_ = 0;  // -1 sizes in output_shapes
  absl::InlinedVector<OutputShape, 2> output_plan_;  // per output
  std::vector<PartialTensorShape> output_shapes_;
  // A relay.build model of three files: library is [lib, graph JSON, params]
  // (then the gradient's libraries), and these are the digests of the last two.
  Status GraphFunction(OpKernelContext* ctx, const Tensor& library, DLDevice device,
                       const Resolved** fn) {
    if (library.dims() != 1 || library.NumElements() < 3) {
      return errors::InvalidArgument(type_string(), ": function '", func_name(),
                                     "': a relay.build model's library input is its library, graph "
                                     "JSON and params, got shape ", library.shape().DebugString());
    }
    const auto paths = library.flat<tensorflow::tstring>();
    const std::string lib(paths(0)), graph(paths(1)), params(paths(2));
    const TvmdsoopGraphFiles files = {graph.c_str(), graph_sha256_[0].c_str(), params.c_str(),
                                      graph_sha256_[1].c_str()};
    return FunctionFor(absl::StrCat(lib, absl::string_view("\0", 1), graph, absl::string_view("\0", 1), params),
                       lib_sha256_, device, /*allow_models=*/true, fn, &files);
  }

  std::string lib_sha256_;
  std::vector<std::string> graph_sha256_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TVMDSOOp").Device(tensorflow::DEVICE_CPU),
                        TVMDSOOpKernel<CpuPlacement>);

// The GPU kernel needs no CUDA toolkit to build: TF's stream executor headers
// give the stream, and TVM launches the CUDA work. Shapes and the library path
// stay in host memory, so reading them needs no device-to-host copy.
REGISTER_KERNEL_BUILDER(Name("TVMDSOOp")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("output_dims")
                            .HostMemory("library"),
                        TVMDSOOpKernel<GpuPlacement>);

}  // namespace tvmdsoop
