// status.cc: TVM errors as TF statuses (status.h), built only when a call has
// failed.
#include "kernels/status.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {
namespace {

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

}  // namespace

Status TVMCallFailure(absl::string_view where, const DsoopError& err, absl::string_view detail) {
  return Status(CodeForTVMError(err.kind),
                absl::StrCat(where, " failed: ", err.kind ? err.kind : "Error", ": ",
                             err.message ? err.message : "", detail));
}

}  // namespace internal
}  // namespace tvmdsoop
