// eager_call.cc: eager calls of a function that returns its outputs, from Python
// through ctypes (tf_op/_eager.py), without TF's op dispatch. TF's eager
// execution of one op costs 25-45 µs on a 2-core Zen 4, more than a small
// model's whole call in TVM. The inputs come as DLPack tensors TF lends
// (tf.experimental.dlpack.to_dlpack), the outputs go back as DLPack tensors TF
// takes (from_dlpack). The function is resolved once, by Go, as a kernel's is,
// and shared with the kernels of the same function (resolved.h); a call is C++
// calling the model's VM or the function, as the kernel's call is.
//
// TVMDSOOpEagerOpen(lib_path, func_name, sha256, num_out, dtypes, ranks, dims,
//                   &handle, &message)
//   resolves the function on the CPU, with what the op would declare of its
//   num_out outputs: each one's TF dtype (DT_INVALID, 0: the first input's) and
//   shape (ranks[i] -1: any; else ranks[i] of dims, in order, -1 where any):
//   0, or a TF status code and a malloc'ed message.
// TVMDSOOpEagerClose(handle) gives it back.
// TVMDSOOpEagerCall(handle, inputs, num_in, alignment, outputs, &message)
//   calls it. kUseTheOp (-1), having taken nothing, where the op would do more
//   than lend the inputs (an input on another device, or not at `alignment`: the
//   op copies it); else it has taken every input (each one's deleter runs when
//   TVM drops it, whatever happens), and returns 0 with num_out DLPack views in
//   outputs, the caller's, checked as the op checks them (in C++: in Python the
//   check was a tenth of a small model's eager call), or a TF status code and a
//   malloc'ed message.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "dsoop/dsoop.h"
#include "dsoop/vm.h"
#include "kernels/call.h"
#include "_cgo_export.h"

namespace tvmdsoop {
namespace internal {
namespace {

constexpr int kUseTheOp = -1;

// TF's status codes (absl::StatusCode's values), for Python's tf.errors classes.
constexpr int kInvalidArgument = 3;
constexpr int kResourceExhausted = 8;
constexpr int kInternal = 13;

// A function resolved for eager calls, and what the op would declare of its outputs.
struct EagerFunction {
  const Resolved* fn = nullptr;
  std::vector<::tensorflow::DataType> dtypes;  // DT_INVALID: the first input's
  std::vector<::tensorflow::PartialTensorShape> shapes;
  bool takes_first_dtype = false;  // some output is DT_INVALID: the first input's dtype is looked up

  ~EagerFunction() {
    if (fn != nullptr) Release(fn);
  }
};

int Fail(int code, const std::string& message, char** out) {
  *out = strdup(message.c_str());
  return code;
}

int Fail(const ::tensorflow::Status& status, char** out) {
  return Fail(static_cast<int>(status.code()), std::string(status.message()), out);
}

// The error's message, for a failure's own words.
std::string Said(const DsoopError& err) { return err.message != nullptr ? err.message : ""; }

// An output copied to TF's alignment (kTFAlignment: TF takes one below it as a
// copy, in the kernel too), as a DLPack tensor that owns the copy.
struct CopiedTensor {
  DLManagedTensor managed;
  AlignedBuffer data;
  absl::InlinedVector<int64_t, 6> shape;

  static void Delete(DLManagedTensor* self) { delete static_cast<CopiedTensor*>(self->manager_ctx); }
};

// The view as TF takes it: itself, or its copy at TF's alignment. What the op's
// kernel refuses (a strided view; memory on a device) is refused the same way.
int ForTF(const std::string& where, int i, ManagedPtr* view, char** message) {
  const DLTensor& dl = (*view)->dl_tensor;
  if (dl.device.device_type != kDLCPU) {
    return Fail(kInternal,
                absl::StrCat(where, ": output ", i, " is on device type ", dl.device.device_type, " ",
                             dl.device.device_id, "; the op runs on device type ", kDLCPU, " 0"),
                message);
  }
  if (!IsCompact(dl)) {
    return Fail(kInvalidArgument,
                absl::StrCat(where, ": output ", i, " is a strided view; the op takes compact tensors only"),
                message);
  }
  const char* data = static_cast<const char*>(dl.data) + dl.byte_offset;
  if (IsAligned(data, kTFAlignment)) return 0;
  auto copy = std::make_unique<CopiedTensor>();
  size_t bytes = (static_cast<size_t>(dl.dtype.bits) * dl.dtype.lanes + 7) / 8;
  for (int d = 0; d < dl.ndim; ++d) {
    copy->shape.push_back(dl.shape[d]);
    bytes *= static_cast<size_t>(dl.shape[d]);
  }
  const ::tensorflow::Status allocated = AllocateAligned(bytes, kTFAlignment, &copy->data);
  if (!allocated.ok()) return Fail(kResourceExhausted, absl::StrCat(where, ": output ", i, ": ",
                                                                    allocated.message()), message);
  if (bytes > 0) std::memcpy(copy->data.get(), data, bytes);
  DLTensor& out = copy->managed.dl_tensor;
  out = dl;
  out.data = copy->data.get();
  out.byte_offset = 0;
  out.shape = copy->shape.data();
  out.strides = nullptr;
  copy->managed.manager_ctx = copy.get();
  copy->managed.deleter = CopiedTensor::Delete;
  view->reset(&copy.release()->managed);
  return 0;
}

// Whether the kernel would lend the input as it is: on the CPU, at the alignment
// (Func checks that it is a power of two).
bool Lendable(const DLTensor& t, int64_t alignment) {
  return t.device.device_type == kDLCPU && IsAligned(static_cast<const char*>(t.data) + t.byte_offset, alignment);
}

int Call(const EagerFunction& eager, DLManagedTensor** inputs, int num_in, DLManagedTensor** outputs,
         char** message) {
  const Resolved& fn = *eager.fn;
  const std::string& where = fn.where;
  const int num_out = static_cast<int>(eager.dtypes.size());
  // What an output declared with the first input's dtype has (the inputs are TVM's after the call).
  ::tensorflow::DataType first_dtype = ::tensorflow::DT_INVALID;
  if (eager.takes_first_dtype && num_in > 0) FromDLDataType(inputs[0]->dl_tensor.dtype, &first_dtype);
  absl::InlinedVector<ManagedPtr, 8> taken;
  for (int i = 0; i < num_in; ++i) taken.emplace_back(inputs[i]);
  if (fn.target.arity >= 0 && num_in != fn.target.arity) {
    return Fail(kInvalidArgument,
                absl::StrCat(where, ": the model's function takes ", fn.target.arity, " input(s), got ", num_in),
                message);
  }
  DsoopError err = {nullptr, nullptr};
  absl::InlinedVector<ObjectPtr, 8> lent;
  absl::InlinedVector<TVMFFIAny, 8> args(num_in);
  for (int i = 0; i < num_in; ++i) {
    TVMFFIObjectHandle handle = nullptr;
    if (dsoop_tensor_from_dlpack(taken[i].get(), &handle, &err) != 0) {
      const std::string said = Said(err);
      dsoop_error_clear(&err);
      return Fail(kResourceExhausted, absl::StrCat(where, ": input ", i, ": ", said), message);
    }
    taken[i].release();  // TVM's now, deleted when it drops the tensor
    lent.emplace_back(handle);
    args[i].type_index = kTVMFFITensor;
    args[i].zero_padding = 0;
    args[i].v_obj = static_cast<TVMFFIObject*>(handle);
  }
  ReturnedValue result;
  const int rc = fn.is_model() ? dsoop_vm_call(fn.target.pool, fn.target.vm_index, args.data(), num_in,
                                               /*stream=*/nullptr, &result.value, &err)
                               : dsoop_call(&fn.target.fn, args.data(), num_in, &result.value, &err);
  if (rc != 0) {
    const ::tensorflow::Status status = TVMCallFailure(where, err);
    dsoop_error_clear(&err);
    return Fail(status, message);
  }
  lent.clear();  // TVM keeps its own references to what it holds on to

  absl::InlinedVector<TVMFFIObjectHandle, 4> handles(num_out, nullptr);
  const int count = dsoop_result_tensors(&result.value, handles.data(), num_out, &err);
  absl::InlinedVector<ObjectPtr, 4> returned;
  for (TVMFFIObjectHandle h : handles) returned.emplace_back(h);
  if (count < 0) {
    const std::string said = Said(err);
    dsoop_error_clear(&err);
    return Fail(kInvalidArgument, absl::StrCat(where, ": ", said), message);
  }
  if (count != num_out) {
    return Fail(kInvalidArgument,
                absl::StrCat(where, ": returned ", count, " tensor(s), but the op declares ", num_out,
                             " output(s) (output_shapes/output_dtypes)"),
                message);
  }
  absl::InlinedVector<ManagedPtr, 4> views(num_out);
  for (int i = 0; i < num_out; ++i) {
    DLManagedTensor* view = nullptr;
    if (dsoop_tensor_to_dlpack(returned[i].get(), &view, &err) != 0) {
      const std::string said = Said(err);
      dsoop_error_clear(&err);
      return Fail(kInternal, absl::StrCat(where, ": output ", i, ": ", said), message);
    }
    views[i].reset(view);
    const ::tensorflow::DataType dtype = eager.dtypes[i] != ::tensorflow::DT_INVALID ? eager.dtypes[i] : first_dtype;
    if (dtype == ::tensorflow::DT_INVALID) {
      return Fail(kInvalidArgument,
                  absl::StrCat(where, ": output ", i, " takes the first input's dtype, but there is no input"),
                  message);
    }
    ::tensorflow::TensorShape shape;
    const ::tensorflow::Status declared = CheckDeclaredOutput(where, i, views[i]->dl_tensor, dtype,
                                                              eager.shapes[i], &shape);
    if (!declared.ok()) return Fail(declared, message);
    if (const int failed = ForTF(where, i, &views[i], message); failed != 0) return failed;
  }
  for (int i = 0; i < num_out; ++i) outputs[i] = views[i].release();
  return 0;
}

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

extern "C" {

__attribute__((visibility("default"))) int TVMDSOOpEagerOpen(const char* lib_path, const char* func_name,
                                                             const char* sha256, int num_out, const int* dtypes,
                                                             const int* ranks, const int64_t* dims,
                                                             const void** handle, char** message) {
  using tvmdsoop::internal::EagerFunction;
  using tvmdsoop::internal::Resolved;
  *handle = nullptr;
  *message = nullptr;
  auto r = std::make_unique<Resolved>();
  r->lib_path = lib_path;
  r->where = absl::StrCat("TVMDSOOp: function '", func_name, "' of ", lib_path);
  char* said = nullptr;
  const int code = tvmdsoopResolve(const_cast<char*>(lib_path), const_cast<char*>(func_name),
                                   const_cast<char*>(sha256), /*graph=*/nullptr, kDLCPU, /*device_id=*/0,
                                   /*allow_models=*/1, &r->target, &said);
  if (code != 0) {
    *message = strdup(absl::StrCat(r->where, ": ", said != nullptr ? said : "unknown error").c_str());
    std::free(said);
    return code;
  }
  auto eager = std::make_unique<EagerFunction>();
  eager->fn = tvmdsoop::internal::Shared(std::move(r));
  for (int i = 0; i < num_out; ++i) {
    eager->dtypes.push_back(static_cast<::tensorflow::DataType>(dtypes[i]));
    eager->takes_first_dtype |= eager->dtypes.back() == ::tensorflow::DT_INVALID;
    ::tensorflow::PartialTensorShape shape;  // unknown rank
    if (ranks[i] >= 0) {
      const ::tensorflow::Status made = ::tensorflow::PartialTensorShape::BuildPartialTensorShape(
          absl::Span<const int64_t>(dims, ranks[i]), &shape);
      if (!made.ok()) {
        *message = strdup(absl::StrCat(eager->fn->where, ": output ", i, ": ", made.message()).c_str());
        return static_cast<int>(made.code());
      }
      dims += ranks[i];
    }
    eager->shapes.push_back(std::move(shape));
  }
  *handle = eager.release();
  return 0;
}

__attribute__((visibility("default"))) void TVMDSOOpEagerClose(const void* handle) {
  delete static_cast<const tvmdsoop::internal::EagerFunction*>(handle);
}

__attribute__((visibility("default"))) int TVMDSOOpEagerCall(const void* handle, DLManagedTensor** inputs,
                                                             int num_in, int64_t alignment,
                                                             DLManagedTensor** outputs, char** message) {
  using namespace tvmdsoop::internal;  // NOLINT: this file's own helpers
  *message = nullptr;
  for (int i = 0; i < num_in; ++i) {
    if (!Lendable(inputs[i]->dl_tensor, alignment)) return kUseTheOp;
  }
  return Call(*static_cast<const EagerFunction*>(handle), inputs, num_in, outputs, message);
}

}  // extern "C"
