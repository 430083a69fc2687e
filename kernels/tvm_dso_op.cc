// tvm_dso_op.cc: the TensorFlow side of TVMDSOOp. TF tensors become DLTensors here
// (without a copy when their buffers are aligned), and the TVM function is called
// through dsoop.h. The function is resolved once per kernel and library, by Go;
// after that Compute runs no Go and takes no lock.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dsoop/dsoop.h"
#include "dsoop/vm.h"
#include "kernels/target.h"
#include "kernels/tf_compat.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"
#include "_cgo_export.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::DataTypeVector;
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

// The status of a TVM function that failed with err: "<where> failed: <kind>:
// <message>" and detail after it, coded by the error's kind.
Status TVMCallFailure(absl::string_view where, const DsoopError& err, absl::string_view detail = "") {
  return Status(CodeForTVMError(err.kind),
                absl::StrCat(where, " failed: ", err.kind ? err.kind : "Error", ": ",
                             err.message ? err.message : "", detail));
}

// Memory from aligned_alloc, for buffers TF gave us below the requested alignment.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeDeleter>;

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

// The -1 dimensions of output_shapes, one output_dims value each: the shape
// function and the kernel count them alike.
int64_t NumDynamicDims(absl::Span<const PartialTensorShape> shapes) {
  int64_t n = 0;
  for (const PartialTensorShape& s : shapes) {
    for (int d = 0; d < s.dims(); ++d) n += s.dim_size(d) < 0 ? 1 : 0;
  }
  return n;
}

// alignment: a power of two (the attr is checked so), tested with a mask, not a division.
bool IsAligned(const void* p, int64_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) & (static_cast<uintptr_t>(alignment) - 1)) == 0;
}

// Fails a call with the status make_status builds. Each instance is cold and
// out of line, so that building an error message (a StrCat of many pieces) stays
// off the cache lines the per-call path runs from: in a graph of many small ops
// that path runs from the L1 instruction cache beside TF's executor, and with
// the messages inline an in-place add-one missed it 25 times an application
// against tf.add's 9 (docs/profile.md, seventh round).
template <typename MakeStatus>
ABSL_ATTRIBUTE_COLD ABSL_ATTRIBUTE_NOINLINE void FailCall(OpKernelContext* ctx, const char* file,
                                                           int line, MakeStatus make_status) {
  ctx->CtxFailure(file, line, make_status());
}

// OP_REQUIRES for the per-call paths: the same check, its failure in FailCall.
#define CALL_REQUIRES(ctx, condition, status)                                      \
  do {                                                                             \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                        \
      FailCall((ctx), __FILE__, __LINE__, [&]() -> Status { return (status); });   \
      return;                                                                      \
    }                                                                              \
  } while (0)

// CALL_REQUIRES after a dsoop call that reports its failure in err: the status
// may read err, which is cleared once the status is built.
#define CALL_REQUIRES_DSOOP(ctx, condition, err, status)                           \
  do {                                                                             \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                        \
      FailCall((ctx), __FILE__, __LINE__, [&]() -> Status { return (status); });   \
      dsoop_error_clear(&(err));                                                   \
      return;                                                                      \
    }                                                                              \
  } while (0)

Status AllocateAligned(size_t size, int64_t alignment, AlignedBuffer* out) {
  const size_t a = static_cast<size_t>(alignment);
  const size_t rounded = (size + a - 1) / a * a;  // aligned_alloc wants a multiple
  out->reset(static_cast<char*>(std::aligned_alloc(a, rounded == 0 ? a : rounded)));
  if (*out == nullptr) {
    return errors::ResourceExhausted("cannot allocate ", size, " bytes of scratch memory aligned to ",
                                     alignment, " bytes (the buffer TF gave is not so aligned)");
  }
  return Status();
}

// size bytes aligned to alignment inside a temporary TF buffer on the kernel's
// device (*block, which the caller keeps for as long as the bytes are used).
Status AlignedTemp(OpKernelContext* ctx, size_t size, int64_t alignment, Tensor* block, char** out) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(size + alignment)}), block));
  const auto base = reinterpret_cast<uintptr_t>(block->tensor_data().data());
  const auto a = static_cast<uintptr_t>(alignment);
  *out = reinterpret_cast<char*>((base + a - 1) / a * a);
  return Status();
}

// The buffers of a kernel's CPU outputs, kept for its next calls where TF's
// allocator would cost a visible share of the call.
// Large outputs: TF's CPU allocator takes a large buffer fresh from mmap, in 4 KiB
// pages, and gives it back on free: every call of a function with a 64 MiB output
// paid the first touch of 16k pages, the kernel's page faults and zeroing, 5 to 6
// times the work of an add-one (docs/benchmarks.md, large tensors). A kernel keeps
// up to max_idle of its output buffers once TF drops them and gives one to its next
// output of the same size, its pages warm. New ones are 2 MiB aligned and ask for
// transparent huge pages: a fault per 2 MiB the first time.
// Small outputs: TF's allocation (an aligned malloc, its bookkeeping, the free)
// cost about 0.3 us a call, as much as the rest of the op on one element. A kernel
// keeps one small buffer, in a slot taken and filled without a lock.
class OutputPool {
 public:
  // Outputs up to this size, and from kMinBytes on, come from the pool.
  static constexpr size_t kSmallMaxBytes = size_t{64} << 10;
  static constexpr size_t kMinBytes = size_t{4} << 20;

  explicit OutputPool(size_t max_idle) : max_idle_(max_idle) {}
  ~OutputPool() {
    for (const auto& [size, data] : idle_) std::free(data);
    std::free(spare_.load(std::memory_order_acquire));
  }
  OutputPool(const OutputPool&) = delete;
  OutputPool& operator=(const OutputPool&) = delete;

  // Whether an output of size bytes comes from the pool (empty ones need no memory).
  bool Serves(size_t size) const {
    return max_idle_ > 0 && size > 0 && (size <= kSmallMaxBytes || size >= kMinBytes);
  }

  // size bytes (Serves(size)), warm when the pool has a buffer of that size;
  // nullptr when memory ran out.
  char* Take(size_t size) { return size <= kSmallMaxBytes ? TakeSmall(size) : TakeLarge(size); }

  // A buffer of Take's that TF no longer uses.
  void Give(char* data, size_t size) {
    if (size <= kSmallMaxBytes) {
      GiveSmall(data);
    } else {
      GiveLarge(data, size);
    }
  }

 private:
  // A small buffer follows a header that holds its capacity, so that the slot is one pointer.
  static constexpr size_t kSmallHeader = 64;  // TF's own alignment for the data behind it

  char* TakeSmall(size_t size) {
    char* block = spare_.exchange(nullptr, std::memory_order_acq_rel);
    if (block != nullptr) {
      if (size <= *reinterpret_cast<size_t*>(block)) return block + kSmallHeader;
      std::free(block);  // too small: the output's shape grew
    }
    const size_t capacity = (size + kSmallHeader - 1) / kSmallHeader * kSmallHeader;
    block = static_cast<char*>(std::aligned_alloc(kSmallHeader, kSmallHeader + capacity));
    if (block == nullptr) return nullptr;
    *reinterpret_cast<size_t*>(block) = capacity;
    return block + kSmallHeader;
  }

  // Into the slot, in place of a buffer there (a call ran beside): the one given
  // back last is the likelier to be in cache still.
  void GiveSmall(char* data) {
    std::free(spare_.exchange(data - kSmallHeader, std::memory_order_acq_rel));
  }

  // Idle large buffers of other sizes are freed: an output whose size changed
  // does not keep the old size's memory.
  char* TakeLarge(size_t size) {
    std::vector<std::pair<size_t, char*>> stale;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->first == size) {
          char* data = it->second;
          idle_.erase(it);
          return data;
        }
      }
      stale.swap(idle_);
    }
    for (const auto& [stale_size, data] : stale) std::free(data);
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;  // aligned_alloc wants it
    void* data = std::aligned_alloc(kHugePage, rounded);
#ifdef MADV_HUGEPAGE
    // A hint: a kernel without THP ignores or refuses it, and nothing changes.
    if (data != nullptr) madvise(data, rounded, MADV_HUGEPAGE);
#endif
    return static_cast<char*>(data);
  }

  // Kept in place of the one kept longest, which is freed when max_idle are kept
  // already (of an older size, when shapes change). A pool that keeps none lends
  // none (Serves), so nothing comes back to it.
  void GiveLarge(char* data, size_t size) {
    char* evicted = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_.size() >= max_idle_) {
        evicted = idle_.front().second;
        idle_.erase(idle_.begin());
      }
      idle_.emplace_back(size, data);
    }
    std::free(evicted);
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<size_t, char*>> idle_;  // large buffers
  std::atomic<char*> spare_{nullptr};           // a small buffer's block
  const size_t max_idle_;
};

// A TF buffer over memory of an OutputPool, given back to the pool when TF
// drops it. The pool lives until the last of its buffers does.
class PooledBuffer : public tensorflow::TensorBuffer {
 public:
  PooledBuffer(std::shared_ptr<OutputPool> pool, char* data, size_t size)
      : TensorBuffer(data), pool_(std::move(pool)), size_(size) {}
  ~PooledBuffer() override { pool_->Give(static_cast<char*>(data()), size_); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocated_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("tvmdsoop_output_pool");
    proto->set_ptr(reinterpret_cast<uintptr_t>(data()));
  }
  bool OwnsMemory() const override { return true; }

 private:
  std::shared_ptr<OutputPool> pool_;
  size_t size_;
};

// How many idle large output buffers a kernel keeps (and whether it keeps a
// small one, unless 0): $TVMDSOOP_OUTPUT_POOL, default 2.
// One serves calls one at a time (the caller holds the last output while the
// next call runs, then drops it); two serve two calls at once, or two outputs of
// a size; 0 turns the pool off.
Status OutputPoolSize(size_t* n) {
  *n = 2;
  const char* value = std::getenv("TVMDSOOP_OUTPUT_POOL");
  if (value == nullptr || *value == '\0') return Status();
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1024) {
    return errors::InvalidArgument("TVMDSOOP_OUTPUT_POOL must be a number of buffers from 0 to 1024, got '",
                                   value, "'");
  }
  *n = static_cast<size_t>(parsed);
  return Status();
}

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

// A function resolved from one library: a plain function, or a function of a
// whole model with the pool of VM instances that runs it. A call reads the
// path (its size, then its characters) and the function: declared first, together.
struct alignas(64) Resolved {
  std::string lib_path;
  TvmdsoopTarget target;
  std::string where;  // "TVMDSOOp: function 'f' of /lib.so", built once for messages

  bool is_model() const { return target.pool != nullptr; }

  bool SameAs(const Resolved& o) const {
    return lib_path == o.lib_path && where == o.where && target.fn.handle == o.target.fn.handle &&
           target.fn.safe_call == o.target.fn.safe_call && target.fn.self == o.target.fn.self &&
           target.pool == o.target.pool && target.vm_index == o.target.vm_index &&
           target.arity == o.target.arity;
  }
};

// The process's one Resolved for each function of a loaded library (dsoop gives
// every lookup of it the same object): the kernels of the function point to it,
// so what their calls read of it stays in cache however many kernels there are.
// It lives as long as the process, as the library does (kernels.go keeps it
// loaded); r's function reference is released when an equal one is there
// already (a model's pool is never released: pools live as long as the process).
const Resolved* Shared(std::unique_ptr<Resolved> r) {
  static std::mutex mu;
  static auto* all = new std::multimap<std::string, std::unique_ptr<Resolved>>();  // by where
  std::lock_guard<std::mutex> lock(mu);
  auto [first, last] = all->equal_range(r->where);
  for (auto it = first; it != last; ++it) {
    if (it->second->SameAs(*r)) {
      dsoop_object_release(r->target.fn.handle);
      return it->second.get();
    }
  }
  const std::string where = r->where;
  return all->emplace(where, std::move(r))->second.get();
}

// Releases a TVM object handle.
struct ObjectReleaser {
  void operator()(void* handle) const { dsoop_object_release(handle); }
};
using ObjectPtr = std::unique_ptr<void, ObjectReleaser>;

// Gives a DLPack view back to its owner.
struct ManagedDeleter {
  void operator()(DLManagedTensor* m) const {
    if (m->deleter != nullptr) m->deleter(m);
  }
};
using ManagedPtr = std::unique_ptr<DLManagedTensor, ManagedDeleter>;

// What a function returned, released when it goes out of scope.
struct ReturnedValue {
  TVMFFIAny value{kTVMFFINone, 0, {0}};
  ~ReturnedValue() {
    if (value.type_index >= kTVMFFIStaticObjectBegin) dsoop_any_release(&value);  // a call only then
  }
};

// A TF tensor lent to TVM as a Tensor object, without a copy. TVM holds it, and
// with it a reference to TF's buffer, until it drops the object: after the call,
// when an output is the input itself.
struct LentTensor {
  DLManagedTensor managed;
  Tensor keep;
  absl::InlinedVector<int64_t, 6> shape;

  static void Delete(DLManagedTensor* self) { delete static_cast<LentTensor*>(self->manager_ctx); }
};

// The alignment TF requires of a tensor's buffer (EIGEN_MAX_ALIGN_BYTES in its
// builds): memory TVM returns is taken as it is only when it has it.
constexpr int64_t kTFAlignment = 64;

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

// Whether a DLTensor is compact row-major (no strides, or the compact ones).
bool IsCompact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
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
  Status FunctionFor(absl::string_view lib_path, const std::string& sha256, DLDevice device,
                     bool allow_models, const Resolved** out) {
    const Resolved* latest = latest_.load(std::memory_order_acquire);
    if (ABSL_PREDICT_TRUE(latest != nullptr && latest->lib_path == lib_path)) {
      *out = latest;
      return Status();
    }
    return Resolve(lib_path, sha256, device, allow_models, out);
  }

  const std::string& func_name() const { return func_name_; }

  // Names the call in messages: the function and the library it comes from.
  std::string Where(absl::string_view lib_path) const {
    return absl::StrCat(type_string(), ": function '", func_name_, "' of ", lib_path);
  }

 private:
  // FunctionFor's first call for lib_path, kept out of the call's path.
  ABSL_ATTRIBUTE_NOINLINE Status Resolve(absl::string_view lib_path, const std::string& sha256,
                                         DLDevice device, bool allow_models, const Resolved** out) {
    // Paths resolved before hold no NUL byte: only a new one needs the check.
    if (std::memchr(lib_path.data(), 0, lib_path.size()) != nullptr) {
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
    r->where = Where(lib_path);
    char* message = nullptr;
    const int code = tvmdsoopResolve(const_cast<char*>(r->lib_path.c_str()),
                                     const_cast<char*>(func_name_.c_str()),
                                     const_cast<char*>(sha256.c_str()), device.device_type,
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
  template <typename Placement>
  void Call(OpKernelContext* ctx, Placement& placement, const Resolved& fn, int num_in,
            absl::Span<const TensorShape* const> out_shapes) {
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

  // Calls a function that returns its outputs (every function of a model, and
  // plain functions made with returns=True) on inputs [0, num_in), lent to TVM
  // without a copy, and makes what it returned the op's outputs: without a copy
  // where TF can take the memory, else copied. What came back is checked against
  // what the op declares: the count, each dtype, each known dimension.
  template <typename Placement>
  void CallReturning(OpKernelContext* ctx, Placement& placement, const Resolved& fn, int num_in,
                     absl::Span<const PartialTensorShape> declared) {
    const std::string& where = fn.where;
    const TvmdsoopTarget& target = fn.target;
    CALL_REQUIRES(ctx, target.arity < 0 || num_in == target.arity,
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
      CALL_REQUIRES(ctx, ToDLDataType(t.dtype(), &dl.dtype),
                    errors::InvalidArgument(where, ": input ", i, " has dtype ",
                                            tensorflow::DataTypeString(t.dtype()),
                                            ", which DLPack cannot describe"));
      lent->keep = t;
      char* data = const_cast<char*>(t.tensor_data().data());
      const size_t size = t.TotalBytes();
      if (size > 0 && !IsAligned(data, alignment_)) {
        // The copy lives as long as TVM holds the tensor, like TF's own buffer.
        Tensor block;
        char* aligned = nullptr;
        OP_REQUIRES_OK(ctx, AlignedTemp(ctx, size, alignment_, &block, &aligned));
        OP_REQUIRES_OK(ctx, placement.Copy(aligned, data, size));
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
      CALL_REQUIRES_DSOOP(ctx, wrapped == 0, err,
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
    CALL_REQUIRES_DSOOP(ctx, rc == 0, err, TVMCallFailure(where, err));
    inputs.clear();  // TVM keeps its own references to what it holds on to

    const int num_out = static_cast<int>(declared.size());
    absl::InlinedVector<TVMFFIObjectHandle, 4> handles(num_out, nullptr);
    const int count = dsoop_result_tensors(&result.value, handles.data(), num_out, &err);
    absl::InlinedVector<ObjectPtr, 4> outputs;
    for (TVMFFIObjectHandle h : handles) outputs.emplace_back(h);
    CALL_REQUIRES_DSOOP(ctx, count >= 0, err,
                        errors::InvalidArgument(where, ": ", err.message ? err.message : ""));
    CALL_REQUIRES(ctx, count == num_out,
                  errors::InvalidArgument(where, ": returned ", count, " tensor(s), but the op declares ",
                                          num_out, " output(s) (output_shapes/output_dtypes)"));
    for (int i = 0; i < num_out; ++i) {
      DLManagedTensor* view = nullptr;
      const int exported = dsoop_tensor_to_dlpack(outputs[i].get(), &view, &err);
      CALL_REQUIRES_DSOOP(ctx, exported == 0, err,
                          errors::Internal(where, ": output ", i, ": ", err.message ? err.message : ""));
      OP_REQUIRES_OK(ctx, SetReturnedOutput(ctx, placement, where, i, ManagedPtr(view), declared[i]));
    }
  }

 private:
  // Makes what a function returned output i: checked against the declared dtype
  // and shape, then taken as it is, or copied where TF cannot take it (below
  // TF's alignment, or on another device).
  template <typename Placement>
  Status SetReturnedOutput(OpKernelContext* ctx, Placement& placement, const std::string& where,
                           int i, ManagedPtr returned, const PartialTensorShape& declared) {
    const DLTensor& dl = returned->dl_tensor;
    const DataType dtype = ctx->expected_output_dtype(i);
    DLDataType want;
    if (!ToDLDataType(dtype, &want)) {
      return errors::InvalidArgument(where, ": output ", i, " is declared ",
                                     tensorflow::DataTypeString(dtype), ", which DLPack cannot describe");
    }
    if (dl.dtype.code != want.code || dl.dtype.bits != want.bits || dl.dtype.lanes != want.lanes) {
      return errors::InvalidArgument(where, ": output ", i, " is ", DLTypeName(dl.dtype),
                                     ", but the op declares ", tensorflow::DataTypeString(dtype));
    }
    TensorShape shape;
    for (int d = 0; d < dl.ndim; ++d) {
      TF_RETURN_IF_ERROR(shape.AddDimWithStatus(dl.shape[d]));
    }
    if (!declared.IsCompatibleWith(shape)) {
      return errors::InvalidArgument(where, ": output ", i, " has shape ", shape.DebugString(),
                                     ", but the op declares ", declared.DebugString());
    }
    if (!IsCompact(dl)) {
      return errors::InvalidArgument(where, ": output ", i,
                                     " is a strided view; the op takes compact tensors only");
    }
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
    if (dl.device.device_type == kDLCPU) return placement.CopyFromHost(dst, data, bytes);
    return errors::Internal(where, ": output ", i, " is on device type ", dl.device.device_type,
                            " ", dl.device.device_id, "; the op runs on device type ",
                            device.device_type, " ", device.device_id);
  }

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

  static std::string DLTypeName(DLDataType t) {
    static const char* const kNames[] = {"int", "uint", "float", "handle", "bfloat", "complex", "bool"};
    if (t.code == kDLBool) return "bool";
    return absl::StrCat(t.code < 7 ? kNames[t.code] : "code", t.bits);
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
  std::vector<const Resolved*> resolved_;  // Shared's, for each path resolved
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

// TVMDSOOp: inputs `args`; `output_dims`, the values of the output dimensions
// that were not known when the graph was built (-1 in `output_shapes`), in order;
// and `library`, the library's path (a tensor, so that a SavedModel asset can
// give it).
template <typename Placement>
class TVMDSOOpKernel : public CallKernel {
 public:
  explicit TVMDSOOpKernel(OpKernelConstruction* ctx) : CallKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lib_sha256", &lib_sha256_));
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
    OP_REQUIRES_OK(ctx, FunctionFor(absl::string_view(lib_path.data(), lib_path.size()),
                                    lib_sha256_, placement.dl_device(), /*allow_models=*/true, &fn));
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
  std::string lib_sha256_;
};

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

Status TVMDSOOpShape(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  if (static_cast<int>(shapes.size()) != c->num_outputs()) {
    return errors::InvalidArgument("", shapes.size(), " output shapes for ",
                                   c->num_outputs(), " output dtypes");
  }
  DataTypeVector arg_types;
  TF_RETURN_IF_ERROR(c->GetAttr("Tin", &arg_types));
  const int num_in = static_cast<int>(arg_types.size());
  const int num_dims_parts = c->num_inputs() - num_in - 1;
  ShapeHandle unused;
  for (int k = 0; k < num_dims_parts; ++k) {
    TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(num_in + k), 1, &unused));
  }
  TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(num_in + num_dims_parts), 1, &unused));
  // A function that returns its outputs gives them the shapes it likes: only
  // what output_shapes declares is known (-1 dimensions stay unknown).
  bool returns = false;
  TF_RETURN_IF_ERROR(c->GetAttr("returns", &returns));
  // The sizes output_dims gives, one per -1 in output_shapes, where the graph
  // knows them: from its constant parts. A part whose values are unknown but whose
  // length is known is skipped; after one of unknown length nothing is known.
  const auto num_dynamic = static_cast<size_t>(NumDynamicDims(shapes));
  std::vector<std::optional<int64_t>> dim_values;
  for (int k = 0; k < num_dims_parts && !returns && dim_values.size() < num_dynamic; ++k) {
    if (const Tensor* part = c->input_tensor(num_in + k); part != nullptr) {
      const auto values = part->flat<int64_t>();
      dim_values.insert(dim_values.end(), values.data(), values.data() + values.size());
      continue;
    }
    const ShapeHandle shape = c->input(num_in + k);
    if (!c->RankKnown(shape)) break;
    const int64_t length = c->Rank(shape) == 0 ? 1 : c->Value(c->Dim(shape, 0));
    if (length < 0) break;
    // At most as many as are wanted: a graph may give a part of any length.
    const size_t skipped = std::min(static_cast<size_t>(length), num_dynamic - dim_values.size());
    dim_values.insert(dim_values.end(), skipped, std::nullopt);
  }
  int next_dynamic = 0;
  for (int i = 0; i < c->num_outputs(); ++i) {
    if (shapes[i].unknown_rank()) {
      c->set_output(i, num_in > 0 && !returns ? c->input(0) : c->UnknownShape());
      continue;
    }
    std::vector<tensorflow::shape_inference::DimensionHandle> dims;
    for (int d = 0; d < shapes[i].dims(); ++d) {
      int64_t size = shapes[i].dim_size(d);
      if (size < 0 && next_dynamic < static_cast<int>(dim_values.size()) && dim_values[next_dynamic]) {
        size = *dim_values[next_dynamic];
        if (size < 0) {
          return errors::InvalidArgument("output ", i, " dimension ", d, " is ", size,
                                         "; sizes must be >= 0");
        }
      }
      if (shapes[i].dim_size(d) < 0) ++next_dynamic;
      dims.push_back(size < 0 ? c->UnknownDim() : c->MakeDim(size));
    }
    c->set_output(i, c->MakeShape(dims));
  }
  return Status();
}

// TVMDSOOpShape, with the function named in its errors.
Status TVMDSOOpShapeWithContext(InferenceContext* c) {
  const Status status = TVMDSOOpShape(c);
  if (status.ok()) return status;
  std::string func_name;
  TF_RETURN_IF_ERROR(c->GetAttr("func_name", &func_name));
  return Status(status.code(), absl::StrCat("TVMDSOOp: function '", func_name, "': ",
                                            status.message()));
}

Status LegacyTvmDsoOpShape(InferenceContext* c) {
  bool has_static = false;
  TF_RETURN_IF_ERROR(c->GetAttr("has_static_output_shape", &has_static));
  const int num_in = c->num_inputs() - 1;
  if (has_static) {
    std::vector<int64_t> dims;
    TF_RETURN_IF_ERROR(c->GetAttr("static_output_shape", &dims));
    std::vector<tensorflow::shape_inference::DimensionHandle> handles;
    for (int64_t d : dims) {
      if (d < 0) return errors::InvalidArgument("TvmDsoOp: static_output_shape has size ", d);
      handles.push_back(c->MakeDim(d));
    }
    c->set_output(0, c->MakeShape(handles));
    return Status();
  }
  ShapeHandle dynamic = c->input(num_in);
  if (c->RankKnown(dynamic) && c->Rank(dynamic) == 1) {
    ShapeHandle s;
    TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(num_in, &s));
    c->set_output(0, s);
  } else if (c->RankKnown(dynamic) && num_in > 0) {
    c->set_output(0, c->input(0));
  } else {
    c->set_output(0, c->UnknownShape());
  }
  return Status();
}

}  // namespace

REGISTER_OP("TVMDSOOp")
    .Input("args: Tin")
    .Input("output_dims: output_dims_parts * int64")
    .Input("library: string")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("output_dims_parts: int >= 0 = 1")
    .Attr("func_name: string")
    .Attr("lib_sha256: string = ''")
    .Attr("output_shapes: list(shape)")
    .Attr("alignment: int = 64")
    .Attr("returns: bool = false")
    .Attr("grad_func: string = ''")
    .Attr("grad_lib_sha256: string = ''")
    .Attr("grad_returns: bool = false")
    .Attr("inplace: list(int) = []")
    .SetShapeFn(TVMDSOOpShapeWithContext)
    .Doc(R"doc(
Calls function `func_name` of the TVM module at path `library` with the inputs,
then the outputs, as DLTensors (TVM's destination-passing convention). A function
of a whole model (a Relax VM executable), or any function when `returns` is true,
takes the inputs only and returns the outputs.

library: the library's path, a scalar; a tensor so that SavedModels can carry the
  library as an asset and find it wherever they are loaded. A vector: the
  library, then the library of the gradient function (carried, never called here).
lib_sha256: the SHA-256 (hex) the library must have; empty for no check.
grad_func: the function giving the gradient (tf_op's registered gradient calls
  it); empty when the op has none. It is in the op's own library, or in
  library[1] when `library` is a vector, whose SHA-256 is `grad_lib_sha256`.
grad_returns: the gradient function returns its outputs.
output_dims: the sizes of the output dimensions given as -1 in `output_shapes`, in
  order: `output_dims_parts` scalars or vectors, concatenated. None when every
  shape is static (graphs written before `output_dims_parts` have one vector).
output_shapes: one per output; an unknown rank means the first input's shape
  (for returning functions: any shape, not checked; -1 dimensions likewise).
returns: the function returns its outputs instead of writing them (implied for
  the functions of a model).
alignment: the least alignment, in bytes, of every buffer handed to TVM; misaligned
  buffers are copied through aligned scratch memory.
inplace: empty, or for each output the input whose buffer it may be written over
  (-1: none). TF hands that buffer over only when nothing else uses the input and
  its dtype and size are the output's; else the output is allocated. For
  functions that tolerate it (element-wise ones); not for returning functions.
)doc");

// The interface of TVM 0.7-0.19's op, unchanged, so its GraphDefs and SavedModels load.
REGISTER_OP("TvmDsoOp")
    .Input("input_args: ListT")
    .Attr("ListT: list({float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64})")
    .Input("dynamic_output_shape: int64")
    .Output("output: output_dtype")
    .Attr("lib_path: string")
    .Attr("func_name: string")
    .Attr("output_dtype: {float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64} = DT_FLOAT")
    .Attr("static_output_shape: list(int) >= 0 = []")
    .Attr("has_static_output_shape: bool")
    .SetShapeFn(LegacyTvmDsoOpShape);

REGISTER_KERNEL_BUILDER(Name("TVMDSOOp").Device(tensorflow::DEVICE_CPU),
                        TVMDSOOpKernel<CpuPlacement>);
REGISTER_KERNEL_BUILDER(Name("TvmDsoOp").Device(tensorflow::DEVICE_CPU),
                        LegacyTvmDsoOpKernel<CpuPlacement>);

// The GPU kernels need no CUDA toolkit to build: TF's stream executor headers
// give the stream, and TVM launches the CUDA work. Shapes and the library path
// stay in host memory, so reading them needs no device-to-host copy.
REGISTER_KERNEL_BUILDER(Name("TVMDSOOp")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("output_dims")
                            .HostMemory("library"),
                        TVMDSOOpKernel<GpuPlacement>);
REGISTER_KERNEL_BUILDER(Name("TvmDsoOp")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("dynamic_output_shape"),
                        LegacyTvmDsoOpKernel<GpuPlacement>);

}  // namespace tvmdsoop
