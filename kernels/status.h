// status.h: how the kernels fail. A TVM error becomes a TF status by its kind
// (TVMCallFailure), and the per-call paths check with CALL_REQUIRES and
// CALL_REQUIRES_DSOOP (failing the op's context), or CALL_CHECK and
// CALL_CHECK_DSOOP (returning the status, for a path whose caller decides), which
// build their messages out of line, in cold code.
#ifndef TVMDSOOP_KERNELS_STATUS_H_
#define TVMDSOOP_KERNELS_STATUS_H_

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/string_view.h"
#include "dsoop/dsoop.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tvmdsoop {
// Hidden from the op library's dynamic symbols: nothing here is its interface.
namespace internal __attribute__((visibility("hidden"))) {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;

// The status of a TVM function that failed with err: "<where> failed: <kind>:
// <message>" and detail after it, coded by the error's kind.
Status TVMCallFailure(absl::string_view where, const DsoopError& err, absl::string_view detail = "");

// Fails a call with the status make_status builds. Each instance is cold and
// out of line, so that building an error message (a StrCat of many pieces) stays
// off the cache lines the per-call path runs from: in a graph of many small ops
// that path runs from the L1 instruction cache beside TF's executor, and it must
// miss that cache no more often than tf.add's does (about 9 misses an
// application; with the messages inline, an in-place add-one missed it 25 times).
template <typename MakeStatus>
ABSL_ATTRIBUTE_COLD ABSL_ATTRIBUTE_NOINLINE void FailCall(OpKernelContext* ctx, const char* file,
                                                           int line, MakeStatus make_status) {
  ctx->CtxFailure(file, line, make_status());
}

// FailCall for a path that returns its failure: the status make_status builds,
// built as cold and out of line.
template <typename MakeStatus>
ABSL_ATTRIBUTE_COLD ABSL_ATTRIBUTE_NOINLINE Status CallFailure(MakeStatus make_status) {
  return make_status();
}

}  // namespace internal
}  // namespace tvmdsoop

// OP_REQUIRES for the per-call paths: the same check, its failure in FailCall.
#define CALL_REQUIRES(ctx, condition, status)                                             \
  do {                                                                                    \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                               \
      ::tvmdsoop::internal::FailCall((ctx), __FILE__, __LINE__,                           \
                                     [&]() -> ::tensorflow::Status { return (status); }); \
      return;                                                                             \
    }                                                                                     \
  } while (0)

// CALL_REQUIRES after a dsoop call that reports its failure in err: the status
// may read err, which is cleared once the status is built.
#define CALL_REQUIRES_DSOOP(ctx, condition, err, status)                                  \
  do {                                                                                    \
    if (ABSL_PREDICT_FALSE(!(condition))) {                                               \
      ::tvmdsoop::internal::FailCall((ctx), __FILE__, __LINE__,                           \
                                     [&]() -> ::tensorflow::Status { return (status); }); \
      dsoop_error_clear(&(err));                                                          \
      return;                                                                             \
    }                                                                                     \
  } while (0)

// CALL_REQUIRES for a path that returns a Status: the same check, returning the
// status that CallFailure builds.
#define CALL_CHECK(condition, status)                          \
  do {                                                         \
    if (ABSL_PREDICT_FALSE(!(condition))) {                    \
      return ::tvmdsoop::internal::CallFailure(                \
          [&]() -> ::tensorflow::Status { return (status); }); \
    }                                                          \
  } while (0)

// CALL_CHECK after a dsoop call that reports its failure in err: the status may
// read err, which is cleared once the status is built.
#define CALL_CHECK_DSOOP(condition, err, status)                        \
  do {                                                                  \
    if (ABSL_PREDICT_FALSE(!(condition))) {                             \
      ::tensorflow::Status failed_ = ::tvmdsoop::internal::CallFailure( \
          [&]() -> ::tensorflow::Status { return (status); });          \
      dsoop_error_clear(&(err));                                        \
      return failed_;                                                   \
    }                                                                   \
  } while (0)

#endif  // TVMDSOOP_KERNELS_STATUS_H_
