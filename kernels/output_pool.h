// output_pool.h: the buffers of a kernel's CPU outputs that it keeps for its
// next calls (OutputPool), and the TF buffer that lends one to an output
// (PooledBuffer).
#ifndef TVMDSOOP_KERNELS_OUTPUT_POOL_H_
#define TVMDSOOP_KERNELS_OUTPUT_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tvmdsoop {
namespace internal {
// Internal linkage, a copy in each file that includes this (call.h says why).
namespace {

using ::tensorflow::Status;
namespace errors = ::tensorflow::errors;

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
inline Status OutputPoolSize(size_t* n) {
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

}  // namespace
}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_OUTPUT_POOL_H_
