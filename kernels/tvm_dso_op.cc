// tvm_dso_op.cc: the TensorFlow side of TVMDSOOp. TF tensors become DLTensors here
// (without a copy when their buffers are aligned), and the TVM function is called
// through dsoop.h. The function is resolved once, by Go, when TF constructs the
// kernel; Compute runs no Go.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "dsoop/dsoop.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "_cgo_export.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
namespace errors = ::tensorflow::errors;

// The DLPack type of a TF dtype; false for dtypes DLPack cannot describe.
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

// The TF status for an error TVM raised, by TVM's error kind.
absl::StatusCode CodeForTVMError(const char* kind) {
  const std::string k = kind == nullptr ? "" : kind;
  if (k == "ValueError" || k == "TypeError" || k == "AttributeError") {
    return absl::StatusCode::kInvalidArgument;
  }
  if (k == "IndexError") return absl::StatusCode::kOutOfRange;
  if (k == "NotImplementedError") return absl::StatusCode::kUnimplemented;
  if (k == "MemoryError") return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kUnknown;
}

// Memory from aligned_alloc, for buffers TF gave us below the requested alignment.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeDeleter>;

bool IsAligned(const void* p, int64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(alignment) == 0;
}

Status AllocateAligned(size_t size, int64_t alignment, AlignedBuffer* out) {
  const size_t a = static_cast<size_t>(alignment);
  const size_t rounded = (size + a - 1) / a * a;  // aligned_alloc wants a multiple
  out->reset(static_cast<char*>(std::aligned_alloc(a, rounded == 0 ? a : rounded)));
  if (*out == nullptr) {
    return errors::ResourceExhausted("TVMDSOOp: cannot allocate ", size,
                                     " bytes of aligned scratch memory");
  }
  return Status();
}

class TVMDSOOpKernel : public OpKernel {
 public:
  explicit TVMDSOOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lib_path", &lib_path_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("func_name", &func_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("alignment", &alignment_));
    OP_REQUIRES(ctx, alignment_ > 0 && (alignment_ & (alignment_ - 1)) == 0,
                errors::InvalidArgument(Where(), ": alignment must be a power of two, got ",
                                        alignment_));
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes));
    OP_REQUIRES(ctx, static_cast<int>(shapes.size()) == num_outputs(),
                errors::InvalidArgument(Where(), ": ", shapes.size(), " output shapes for ",
                                        num_outputs(), " outputs"));
    for (size_t i = 0; i < shapes.size(); ++i) {
      // An unknown rank means "the shape of the first input", decided per call.
      output_like_input_.push_back(shapes[i].unknown_rank());
      TensorShape fixed;
      if (!shapes[i].unknown_rank()) {
        OP_REQUIRES(ctx, shapes[i].AsTensorShape(&fixed),
                    errors::InvalidArgument(Where(), ": output ", i, " has shape ",
                                            shapes[i].DebugString(),
                                            "; every dimension must be known and >= 0"));
      }
      output_shapes_.push_back(fixed);
    }
    char* message = nullptr;
    const int code = tvmdsoopResolveFunction(const_cast<char*>(lib_path_.c_str()),
                                             const_cast<char*>(func_name_.c_str()), &func_, &message);
    if (code != 0) {
      ctx->CtxFailure(__FILE__, __LINE__,
                      Status(static_cast<absl::StatusCode>(code),
                             absl::StrCat(Where(), ": ", message ? message : "unknown error")));
      std::free(message);
      func_.handle = nullptr;
    }
  }

  ~TVMDSOOpKernel() override { dsoop_object_release(func_.handle); }

  TVMDSOOpKernel(const TVMDSOOpKernel&) = delete;
  TVMDSOOpKernel& operator=(const TVMDSOOpKernel&) = delete;

  void Compute(OpKernelContext* ctx) override {
    const int num_in = ctx->num_inputs();
    const int num_args = num_in + num_outputs();
    absl::InlinedVector<DLTensor, 8> tensors(num_args);
    absl::InlinedVector<TVMFFIAny, 8> args(num_args);
    absl::InlinedVector<AlignedBuffer, 2> scratch;
    // Outputs that TF allocated below the alignment: computed in scratch, copied back.
    absl::InlinedVector<std::pair<Tensor*, const char*>, 2> copy_back;

    // Shapes first: their storage must not move once DLTensors point into it.
    absl::InlinedVector<TensorShape, 8> shapes(num_args);
    int total_rank = 0;
    for (int i = 0; i < num_in; ++i) {
      shapes[i] = ctx->input(i).shape();
      total_rank += shapes[i].dims();
    }
    for (int i = 0; i < num_outputs(); ++i) {
      if (output_like_input_[i]) {
        OP_REQUIRES(ctx, num_in > 0,
                    errors::InvalidArgument(Where(), ": output ", i,
                                            " has no shape and there is no input to take it from"));
        shapes[num_in + i] = ctx->input(0).shape();
      } else {
        shapes[num_in + i] = output_shapes_[i];
      }
      total_rank += shapes[num_in + i].dims();
    }
    absl::InlinedVector<int64_t, 32> dims(total_rank);

    int64_t* next_dims = dims.data();
    for (int i = 0; i < num_args; ++i) {
      const bool is_input = i < num_in;
      Tensor* out = nullptr;
      if (!is_input) {
        OP_REQUIRES_OK(ctx, ctx->allocate_output(i - num_in, shapes[i], &out));
      }
      const Tensor& t = is_input ? ctx->input(i) : *out;
      DLTensor& dl = tensors[i];
      OP_REQUIRES(ctx, ToDLDataType(t.dtype(), &dl.dtype),
                  errors::InvalidArgument(Where(), ": ", ArgName(i, num_in), " has dtype ",
                                          tensorflow::DataTypeString(t.dtype()),
                                          ", which DLPack cannot describe"));
      char* data = const_cast<char*>(t.tensor_data().data());
      const size_t size = t.TotalBytes();
      if (size > 0 && !IsAligned(data, alignment_)) {
        AlignedBuffer buffer;
        OP_REQUIRES_OK(ctx, AllocateAligned(size, alignment_, &buffer));
        if (is_input) {
          std::memcpy(buffer.get(), data, size);
        } else {
          copy_back.emplace_back(out, buffer.get());
        }
        data = buffer.get();
        scratch.push_back(std::move(buffer));
      }
      dl.data = data;
      dl.device = {kDLCPU, 0};
      dl.ndim = shapes[i].dims();
      dl.shape = next_dims;
      for (int d = 0; d < dl.ndim; ++d) *next_dims++ = shapes[i].dim_size(d);
      dl.strides = nullptr;  // TF tensors are compact row-major
      dl.byte_offset = 0;
      args[i].type_index = kTVMFFIDLTensorPtr;
      args[i].zero_padding = 0;
      args[i].v_ptr = &dl;
    }

    DsoopError err = {nullptr, nullptr};
    if (dsoop_function_call(&func_, args.data(), num_args, &err) != 0) {
      ctx->SetStatus(Status(CodeForTVMError(err.kind),
                            absl::StrCat(Where(), " failed: ", err.kind ? err.kind : "Error", ": ",
                                         err.message ? err.message : "", "\n  TVMDSOOp passed ",
                                         DescribeArgs(tensors, num_in))));
      dsoop_error_clear(&err);
      return;
    }
    for (const auto& [out, buffer] : copy_back) {
      std::memcpy(const_cast<char*>(out->tensor_data().data()), buffer, out->TotalBytes());
    }
  }

 private:
  // Names the call in messages: the function and the library it comes from.
  std::string Where() const {
    return absl::StrCat("TVMDSOOp: function '", func_name_, "' of ", lib_path_);
  }

  // "input 0: float32[3], output 0: float32[3]", for error messages.
  static std::string DescribeArgs(const absl::InlinedVector<DLTensor, 8>& tensors, int num_in) {
    std::string out;
    for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
      const DLTensor& t = tensors[i];
      absl::StrAppend(&out, i == 0 ? "" : ", ", ArgName(i, num_in), ": ", DLTypeName(t.dtype), "[",
                      absl::StrJoin(absl::MakeConstSpan(t.shape, t.ndim), ","), "]");
    }
    return out;
  }

  static std::string DLTypeName(DLDataType t) {
    static const char* const kNames[] = {"int", "uint", "float", "handle", "bfloat", "complex", "bool"};
    if (t.code == kDLBool) return "bool";
    return absl::StrCat(t.code < 7 ? kNames[t.code] : "code", t.bits);
  }

  static std::string ArgName(int i, int num_in) {
    return i < num_in ? absl::StrCat("input ", i) : absl::StrCat("output ", i - num_in);
  }

  std::string lib_path_;
  std::string func_name_;
  int64_t alignment_ = 64;
  std::vector<bool> output_like_input_;
  std::vector<TensorShape> output_shapes_;
  DsoopFunction func_ = {nullptr, nullptr};
};

Status TVMDSOOpShape(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  if (static_cast<int>(shapes.size()) != c->num_outputs()) {
    return errors::InvalidArgument("TVMDSOOp: ", shapes.size(), " output shapes for ",
                                   c->num_outputs(), " outputs");
  }
  for (int i = 0; i < c->num_outputs(); ++i) {
    if (shapes[i].unknown_rank()) {
      c->set_output(i, c->num_inputs() > 0 ? c->input(0) : c->UnknownShape());
      continue;
    }
    ShapeHandle s;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
    c->set_output(i, s);
  }
  return Status();
}

}  // namespace

REGISTER_OP("TVMDSOOp")
    .Input("args: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("lib_path: string")
    .Attr("func_name: string")
    .Attr("output_shapes: list(shape)")
    .Attr("alignment: int = 64")
    .SetShapeFn(TVMDSOOpShape)
    .Doc(R"doc(
Calls function `func_name` of the TVM module at `lib_path` with the inputs, then
the outputs, as DLTensors (TVM's destination-passing convention).

output_shapes: one per output; an unknown rank means the first input's shape.
alignment: the least alignment, in bytes, of every buffer handed to TVM; misaligned
  buffers are copied through aligned scratch memory.
)doc");

REGISTER_KERNEL_BUILDER(Name("TVMDSOOp").Device(tensorflow::DEVICE_CPU), TVMDSOOpKernel);

}  // namespace tvmdsoop
