// call.h: what both kernels share (CallKernel): resolving the function at a
// kernel's first call of a library, and the per-call path that hands TF's
// tensors to it and makes what it gives back the op's outputs.
//
// Linkage: the code defined here, and in the headers this includes, is in an
// unnamed namespace, a copy in each kernel's file. GCC splits a function into
// hot and cold parts only when no other file can share its code (never the
// COMDAT copies that inline and template functions of external linkage
// become), and inlines a function called once most readily then; the per-call
// path's layout relies on both, its error paths cold and off the cache lines the
// call runs from. What is defined in a .cc file and called across files is in
// tvmdsoop::internal itself, hidden from the op library's dynamic symbols.
#ifndef TVMDSOOP_KERNELS_CALL_H_
#define TVMDSOOP_KERNELS_CALL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dsoop/dsoop.h"
#include "dsoop/vm.h"
#include "kernels/aligned_buffer.h"
#include "kernels/dlpack_tensor.h"
#include "kernels/output_pool.h"
#include "kernels/resolved.h"
#include "kernels/returned_output.h"
#include "kernels/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "_cgo_export.h"

namespace tvmdsoop {
namespace internal {
// Internal linkage, a copy in each file that includes this (see above).
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Per-call storage left uninitialised, for the call path: every element used is
// written first. Up to N elements live inline (the usual call), more on the heap.
template <typename T, int N>
class UninitializedArray {
 public:
  explicit UninitializedArray(int n)
      : heap_(n > N ? new T[n] : nullptr), data_(heap_ != nullptr ? heap_.get() : inline_) {}
  UninitializedArray(const UninitializedArray&) = delete;
  UninitializedArray& operator=(const UninitializedArray&) = delete;
  T* data() { return data_; }
  T& operator[](int i) { return data_[i]; }

 private:
  T inline_[N];
  std::unique_ptr<T[]> heap_;
  T* const data_;
};

// Releases a TVM object handle.
struct ObjectReleaser {
  void operator()(void* handle) const { dsoop_object_release(handle); }
};
using ObjectPtr = std::unique_ptr<void, ObjectReleaser>;

// What a function returned, released when it goes out of scope.
struct ReturnedValue {
  TVMFFIAny value{kTVMFFINone, 0, {0}};
  ~ReturnedValue() {
    if (value.type_index >= kTVMFFIStaticObjectBegin) dsoop_any_release(&value);  // a call only then
  }
};

// Calls a function that returns its outputs (every function of a model, plain
// functions made with returns=True, the models of tf_op.auto's clusters) on
// inputs [0, num_in), lent to TVM without a copy, and makes what it returned the
// op's outputs: without a copy where TF can take the memory, else copied. What
// came back is checked against what the op declares: the count, each dtype,
// each known dimension.
//
// A failure is returned, not set on ctx (TF cannot take a failure back), so
// that a caller may run the op another way: TVMDSOOpCluster runs TF's function
// then. Until the last step every failure leaves the op's outputs unset: the
// inputs' aligned copies (allocate_temp) and their wrapping for TVM, the call
// itself (whatever TVM's code raises), and the checks of what it returned, all
// of which come before the first output is set. Only the last step, setting the
// outputs, may fail with some of them set: where TF cannot allocate an output
// that must be copied, or a copy to the device fails (ctx->mutable_output tells).
template <typename Placement>
Status CallReturningFunctionStatus(OpKernelContext* ctx, Placement& placement, const Resolved& fn, int num_in,
                                   absl::Span<const PartialTensorShape> declared, int64_t alignment) {
  const std::string& where = fn.where;
  const TvmdsoopTarget& target = fn.target;
  CALL_CHECK(target.arity < 0 || num_in == target.arity,
             errors::InvalidArgument(where, ": the model's function takes ", target.arity,
                                     " input(s), got ", num_in));
  const DLDevice device = placement.dl_device();
  absl::InlinedVector<ObjectPtr, 8> inputs;
  absl::InlinedVector<TVMFFIAny, 8> args(num_in);
  DsoopError err = {nullptr, nullptr};
  for (int i = 0; i < num_in; ++i) {
    const Tensor& t = ctx->input(i);
    auto lent = std::make_unique<LentTensor>();
    DLTensor& dl = lent->managed.dl_tensor;
    CALL_CHECK(ToDLDataType(t.dtype(), &dl.dtype),
               errors::InvalidArgument(where, ": input ", i, " has dtype ",
                                       tensorflow::DataTypeString(t.dtype()),
                                       ", which DLPack cannot describe"));
    lent->keep = t;
    char* data = const_cast<char*>(t.tensor_data().data());
    const size_t size = t.TotalBytes();
    if (size > 0 && !IsAligned(data, alignment)) {
      // The copy lives as long as TVM holds the tensor, like TF's own buffer.
      Tensor block;
      char* aligned = nullptr;
      TF_RETURN_IF_ERROR(AlignedTemp(ctx, size, alignment, &block, &aligned));
      TF_RETURN_IF_ERROR(placement.Copy(aligned, data, size));
      lent->keep = std::move(block);
      data = aligned;
    }
    for (int d = 0; d < t.dims(); ++d) lent->shape.push_back(t.dim_size(d));
    dl.data = data;
    dl.device = device;
    dl.ndim = t.dims();
    dl.shape = lent->shape.data();
    dl.strides = nullptr;
    dl.byte_offset = 0;
    lent->managed.manager_ctx = lent.get();
    lent->managed.deleter = LentTensor::Delete;
    TVMFFIObjectHandle handle = nullptr;
    const int wrapped = dsoop_tensor_from_dlpack(&lent->managed, &handle, &err);
    CALL_CHECK_DSOOP(wrapped == 0, err,
                     errors::ResourceExhausted(where, ": input ", i, ": ", err.message ? err.message : ""));
    lent.release();  // TVM owns it now, and deletes it when it drops the tensor
    inputs.emplace_back(handle);
    args[i].type_index = kTVMFFITensor;
    args[i].zero_padding = 0;
    args[i].v_obj = static_cast<TVMFFIObject*>(handle);
  }

  ReturnedValue result;
  const int rc = fn.is_model() ? dsoop_vm_call(target.pool, target.vm_index, args.data(), num_in,
                                               placement.stream(), &result.value, &err)
                               : placement.Call(target.fn, args.data(), num_in, &result.value, &err);
  CALL_CHECK_DSOOP(rc == 0, err, TVMCallFailure(where, err));
  inputs.clear();  // TVM keeps its own references to what it holds on to

  const int num_out = static_cast<int>(declared.size());
  absl::InlinedVector<TVMFFIObjectHandle, 4> handles(num_out, nullptr);
  const int count = dsoop_result_tensors(&result.value, handles.data(), num_out, &err);
  absl::InlinedVector<ObjectPtr, 4> outputs;
  for (TVMFFIObjectHandle h : handles) outputs.emplace_back(h);
  CALL_CHECK_DSOOP(count >= 0, err, errors::InvalidArgument(where, ": ", err.message ? err.message : ""));
  CALL_CHECK(count == num_out,
             errors::InvalidArgument(where, ": returned ", count, " tensor(s), but the op declares ", num_out,
                                     " output(s) (output_shapes/output_dtypes)"));
  // Every output checked before the first is set (see above).
  absl::InlinedVector<ManagedPtr, 4> views(num_out);
  absl::InlinedVector<TensorShape, 4> shapes(num_out);
  for (int i = 0; i < num_out; ++i) {
    DLManagedTensor* view = nullptr;
    const int exported = dsoop_tensor_to_dlpack(outputs[i].get(), &view, &err);
    CALL_CHECK_DSOOP(exported == 0, err,
                     errors::Internal(where, ": output ", i, ": ", err.message ? err.message : ""));
    views[i].reset(view);
    TF_RETURN_IF_ERROR(
        CheckReturnedOutput(ctx, placement, where, i, views[i]->dl_tensor, declared[i], &shapes[i]));
  }
  for (int i = 0; i < num_out; ++i) {
    TF_RETURN_IF_ERROR(SetReturnedOutput(ctx, placement, i, std::move(views[i]), shapes[i]));
  }
  return Status();
}

// CallReturningFunctionStatus for a kernel whose call fails the op when the
// function fails: the failure set on ctx.
template <typename Placement>
void CallReturningFunction(OpKernelContext* ctx, Placement& placement, const Resolved& fn, int num_in,
                           absl::Span<const PartialTensorShape> declared, int64_t alignment) {
  Status status = CallReturningFunctionStatus(ctx, placement, fn, num_in, declared, alignment);
  if (ABSL_PREDICT_FALSE(!status.ok())) {
    FailCall(ctx, __FILE__, __LINE__, [&]() -> Status { return std::move(status); });
  }
}

// What both ops share: resolving the function (Go, once per library path) and
// calling it on the first `num_in` inputs plus outputs of the shapes the op
// computed. Subclasses read their own attrs and decide the output shapes.
class CallKernel : public OpKernel {
 public:
  explicit CallKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("func_name", &func_name_));
    OP_REQUIRES(ctx, !func_name_.empty() && func_name_.find('\0') == std::string::npos,
                errors::InvalidArgument(type_string(), ": bad function name '", func_name_, "'"));
    size_t pool_size = 0;  // GPU outputs stay with TF's allocator: the setting is not theirs
    if (ctx->device_type() == tensorflow::DEVICE_CPU) {
      OP_REQUIRES_OK(ctx, OutputPoolSize(&pool_size));
    }
    output_pool_ = std::make_shared<OutputPool>(pool_size);
  }

  // TF destroys a kernel with its graph or function (an eager op's, with the
  // eager kernel cache): what it resolved is given back then, and a library no
  // other kernel uses is unloaded.
  ~CallKernel() override {
    for (const Resolved* r : resolved_) Release(r);
  }

  CallKernel(const CallKernel&) = delete;
  CallKernel& operator=(const CallKernel&) = delete;

 protected:
  // What a call needs of each of the function's arguments, fixed when the
  // kernel is made.
  struct ArgSpec {
    DLDataType dtype;  // lanes 0: one DLPack cannot describe, an error only if it reaches TVM
    int16_t reuse;     // an output: the input whose buffer it may be written over, or -1
  };

  // The function's arguments: the op's first num_in inputs, then its outputs
  // (none written over an input yet).
  void SetArguments(int num_in) {
    num_in_ = num_in;
    for (int i = 0; i < num_in; ++i) args_.push_back({DLTypeOf(input_type(i)), -1});
    for (DataType t : output_types()) args_.push_back({DLTypeOf(t), -1});
  }

  int num_outputs_of_function() const { return static_cast<int>(args_.size()) - num_in_; }

  // Output o may be written over input i (checked by the caller).
  void SetReuse(int o, int i) {
    args_[num_in_ + o].reuse = static_cast<int16_t>(i);
    has_inplace_ = true;
  }

  // The function in lib_path, run on device. The first call for a path loads the
  // library and resolves the function through Go (checking the library's SHA-256
  // when `sha256` is not empty; for a model, starting its VMs on the device);
  // later calls find it without a lock or Go. A kernel runs on one device.
  // graph, for a relay.build model of three files, gives its graph and params:
  // lib_path is then those three paths, NUL-separated (the key of what was
  // resolved), and graph's paths the second and third of them.
  Status FunctionFor(absl::string_view lib_path, const std::string& sha256, DLDevice device,
                     bool allow_models, const Resolved** out,
                     const TvmdsoopGraphFiles* graph = nullptr) {
    const Resolved* latest = latest_.load(std::memory_order_acquire);
    if (ABSL_PREDICT_TRUE(latest != nullptr && latest->lib_path == lib_path)) {
      *out = latest;
      return Status();
    }
    return Resolve(lib_path, sha256, device, allow_models, graph, out);
  }

  const std::string& func_name() const { return func_name_; }

  // Names the call in messages: the function and the library it comes from.
  std::string Where(absl::string_view lib_path) const {
    return absl::StrCat(type_string(), ": function '", func_name_, "' of ", lib_path);
  }

 private:
  // FunctionFor's first call for lib_path, kept out of the call's path.
  ABSL_ATTRIBUTE_NOINLINE Status Resolve(absl::string_view lib_path, const std::string& sha256,
                                         DLDevice device, bool allow_models,
                                         const TvmdsoopGraphFiles* graph, const Resolved** out) {
    // Paths resolved before hold no NUL byte: only a new one needs the check
    // (a model of three files: two, its separators).
    const size_t nuls = static_cast<size_t>(std::count(lib_path.begin(), lib_path.end(), '\0'));
    if (nuls != (graph != nullptr ? 2 : 0)) {
      return errors::InvalidArgument(type_string(), ": function '", func_name_,
                                     "': the library path holds a NUL byte");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const Resolved* r : resolved_) {
      if (r->lib_path == lib_path) {
        latest_.store(r, std::memory_order_release);
        *out = r;
        return Status();
      }
    }
    auto r = std::make_unique<Resolved>();
    r->lib_path = std::string(lib_path);
    // c_str() ends at the first NUL: the library's path, for a model of three files too.
    r->where = Where(r->lib_path.c_str());
    char* message = nullptr;
    const int code = tvmdsoopResolve(const_cast<char*>(r->lib_path.c_str()),
                                     const_cast<char*>(func_name_.c_str()),
                                     const_cast<char*>(sha256.c_str()),
                                     const_cast<TvmdsoopGraphFiles*>(graph), device.device_type,
                                     device.device_id, allow_models ? 1 : 0, &r->target, &message);
    if (code != 0) {
      Status status(static_cast<absl::StatusCode>(code),
                    absl::StrCat(r->where, ": ", message ? message : "unknown error"));
      std::free(message);
      return status;
    }
    *out = Shared(std::move(r));
    latest_.store(*out, std::memory_order_release);
    resolved_.push_back(*out);
    return Status();
  }

 protected:
  // Calls the function with inputs [0, num_in) and outputs of out_shapes, one
  // per output (nullptr: input 0's shape), or none when every output takes input
  // 0's shape; the callers have checked that there is an input 0 then. The
  // buffers are on the Placement's device (TVM's destination-passing convention).
  // Out of line, in every kernel: one copy serves all of a Compute's calls of it
  // (TVMDSOOp's has two), and a Compute stays short.
  template <typename Placement>
  ABSL_ATTRIBUTE_NOINLINE void Call(OpKernelContext* ctx, Placement& placement, const Resolved& fn,
                                    int num_in, absl::Span<const TensorShape* const> out_shapes) {
    const std::string& where = fn.where;
    const DLDevice device = placement.dl_device();
    const int num_out = num_outputs_of_function();
    CALL_REQUIRES(ctx, out_shapes.empty() || static_cast<int>(out_shapes.size()) == num_out,
                  errors::Internal(where, ": ", out_shapes.size(), " output shapes for ", num_out,
                                   " outputs"));
    const int num_args = num_in + num_out;
    UninitializedArray<const Tensor*, 8> inputs(num_in);
    int total_rank = 0;
    for (int i = 0; i < num_in; ++i) {
      inputs[i] = &ctx->input(i);
      total_rank += inputs[i]->dims();
    }
    auto out_shape = [&](int o) -> const TensorShape& {
      return out_shapes.empty() || out_shapes[o] == nullptr ? inputs[0]->shape() : *out_shapes[o];
    };
    for (int o = 0; o < num_out; ++o) total_rank += out_shape(o).dims();
    UninitializedArray<DLTensor, 8> tensors(num_args);
    UninitializedArray<TVMFFIAny, 8> args(num_args);
    UninitializedArray<int64_t, 32> dims(total_rank);  // the DLTensors' shapes point into it
    // Outputs that TF allocated below the alignment: computed in scratch, copied back.
    absl::InlinedVector<std::pair<Tensor*, const char*>, 2> copy_back;

    int64_t* next_dims = dims.data();
    for (int i = 0; i < num_args; ++i) {
      const bool is_input = i < num_in;
      Tensor* out = nullptr;
      if (!is_input) {
        // An output declared in place takes its input's buffer when TF allows it
        // (no other user of the input, same dtype and size and memory type).
        const int o = i - num_in;
        const int reuse = args_[i].reuse;
        if (reuse < 0 || !ctx->forward_input_to_output_with_shape(reuse, o, out_shape(o), &out)) {
          const Status allocated = placement.AllocateOutput(ctx, o, out_shape(o), output_pool_, &out);
          CALL_REQUIRES(ctx, allocated.ok(),
                        Status(allocated.code(), absl::StrCat(where, ": ", ArgName(i, num_in), " of shape ",
                                                              out_shape(o).DebugString(), ": ",
                                                              allocated.message())));
        }
      }
      const Tensor& t = is_input ? *inputs[i] : *out;
      DLTensor& dl = tensors[i];
      dl.dtype = args_[i].dtype;
      CALL_REQUIRES(ctx, dl.dtype.lanes != 0,
                    errors::InvalidArgument(where, ": ", ArgName(i, num_in), " has dtype ",
                                            tensorflow::DataTypeString(t.dtype()),
                                            ", which DLPack cannot describe"));
      char* data = static_cast<char*>(t.data());
      if (t.NumElements() > 0 && !IsAligned(data, alignment_)) {
        const size_t size = t.TotalBytes();
        char* aligned = nullptr;
        const Status got = placement.Scratch(ctx, size, alignment_, &aligned);
        CALL_REQUIRES(ctx, got.ok(),
                      Status(got.code(), absl::StrCat(where, ": ", ArgName(i, num_in), ": ",
                                                      got.message())));
        if (is_input) {
          OP_REQUIRES_OK(ctx, placement.Copy(aligned, data, size));
        } else {
          copy_back.emplace_back(out, aligned);
        }
        data = aligned;
      }
      dl.data = data;
      dl.device = device;
      dl.ndim = t.dims();
      dl.shape = next_dims;
      if (dl.ndim == 1) {
        *next_dims++ = t.NumElements();  // inline, where dim_size is a call into TF
      } else {
        for (int d = 0; d < dl.ndim; ++d) *next_dims++ = t.dim_size(d);
      }
      dl.strides = nullptr;  // TF tensors are compact row-major
      dl.byte_offset = 0;
      args[i].type_index = kTVMFFIDLTensorPtr;
      args[i].zero_padding = 0;
      args[i].v_ptr = &dl;
    }

    DsoopError err = {nullptr, nullptr};
    ReturnedValue result;
    const int rc = placement.Call(fn.target.fn, args.data(), num_args, &result.value, &err);
    CALL_REQUIRES_DSOOP(
        ctx, rc == 0, err,
        TVMCallFailure(where, err,
                       absl::StrCat("\n  TVMDSOOp passed ",
                                    DescribeArgs(absl::MakeConstSpan(tensors.data(), num_args), num_in))));
    // A value would be dropped, and the outputs it stands for never written.
    CALL_REQUIRES(ctx, result.value.type_index == kTVMFFINone,
                  errors::InvalidArgument(where, ": the function returned a value (TVM-FFI type index ",
                                          result.value.type_index,
                                          ") where it should write its outputs and return nothing; "
                                          "a function that returns its outputs is made with returns=True"));
    for (const auto& [out, buffer] : copy_back) {
      OP_REQUIRES_OK(ctx, placement.Copy(const_cast<char*>(out->tensor_data().data()), buffer,
                                         out->TotalBytes()));
    }
  }

  // Calls a function that returns its outputs: CallReturningFunction's call,
  // at this kernel's alignment.
  template <typename Placement>
  void CallReturning(OpKernelContext* ctx, Placement& placement, const Resolved& fn, int num_in,
                     absl::Span<const PartialTensorShape> declared) {
    CallReturningFunction(ctx, placement, fn, num_in, declared, alignment_);
  }

 private:
  // "input 0: float32[3], output 0: float32[3]", for error messages.
  static std::string DescribeArgs(absl::Span<const DLTensor> tensors, int num_in) {
    std::string out;
    for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
      const DLTensor& t = tensors[i];
      absl::StrAppend(&out, i == 0 ? "" : ", ", ArgName(i, num_in), ": ", DLTypeName(t.dtype), "[",
                      absl::StrJoin(absl::MakeConstSpan(t.shape, t.ndim), ","), "]");
    }
    return out;
  }

  static std::string ArgName(int i, int num_in) {
    return i < num_in ? absl::StrCat("input ", i) : absl::StrCat("output ", i - num_in);
  }

  static DLDataType DLTypeOf(DataType dtype) {
    DLDataType dl{0, 0, 0};
    return ToDLDataType(dtype, &dl) ? dl : DLDataType{0, 0, 0};
  }

  // Read when resolving, for messages, and by allocating calls. Declared before
  // what every call reads, so that the call's members (below, then the
  // subclass's) are contiguous.
  std::string func_name_;
  std::mutex mu_;  // guards resolving and resolved_
  std::vector<const Resolved*> resolved_;  // Shared's, for each path resolved; released with the kernel
  std::shared_ptr<OutputPool> output_pool_;  // shared with the buffers it lent

  // What each call reads lives inline in the kernel, from a cache line's start,
  // on as few lines as it takes (two, with TVMDSOOp's, for up to four arguments
  // and two outputs): a graph runs many kernels, and each line a call touches
  // is likely a cache miss for each of them.
  alignas(64) std::atomic<const Resolved*> latest_{nullptr};
  absl::InlinedVector<ArgSpec, 4> args_;  // the function's inputs, then its outputs

 protected:
  int64_t alignment_ = 64;
  int num_in_ = 0;            // the function's inputs: the op's first num_in_
  bool has_inplace_ = false;  // some output may be written over an input
};

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_CALL_H_
