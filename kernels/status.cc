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

// The value of `key=` in TVM's ErrorContext, up to `end`; empty when absent.
absl::string_view ContextValue(absl::string_view message, absl::string_view key, absl::string_view end) {
  const size_t start = message.find(key);
  if (start == absl::string_view::npos) return {};
  const absl::string_view rest = message.substr(start + key.size());
  return rest.substr(0, rest.find(end));
}

}  // namespace

Status TVMCallFailure(absl::string_view where, const DsoopError& err, absl::string_view detail) {
  const absl::string_view message = err.message ? err.message : "";
  const std::string tvm = absl::StrCat(err.kind ? err.kind : "Error", ": ", message, detail);
  // A Relax model checks each input against its signature (the VM's
  // match_cast): TVM names the parameter and what it expects, and reports a
  // wrong dimension as a RuntimeError. A mistake in the call all the same.
  const absl::string_view param = ContextValue(message, "loc=param[", "]");
  const absl::string_view annotation = ContextValue(message, "annotation=", ")  ");
  if (!param.empty() && !annotation.empty()) {
    const absl::string_view name = ContextValue(message, "param=", ",");
    return Status(absl::StatusCode::kInvalidArgument,
                  absl::StrCat(where, ": input ", param, name.empty() ? "" : absl::StrCat(" (", name, ")"),
                               " does not match the model's signature, which expects ", annotation, ": ",
                               tvm));
  }
  return Status(CodeForTVMError(err.kind), absl::StrCat(where, " failed: ", tvm));
}

}  // namespace internal
}  // namespace tvmdsoop
