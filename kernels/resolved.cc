// resolved.cc: the process's one Resolved for each function (resolved.h).
#include "kernels/resolved.h"

#include <map>
#include <mutex>
#include <utility>

#include "_cgo_export.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {
namespace {

// A Resolved and the references Shared handed out to it.
struct Counted {
  std::unique_ptr<Resolved> resolved;
  int refs;
};

std::mutex mu;
// By where. Never destroyed: kernels destroyed as the process exits still find it.
auto* const all = new std::multimap<std::string, Counted>();

}  // namespace

const Resolved* Shared(std::unique_ptr<Resolved> r) {
  const Resolved* shared = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [first, last] = all->equal_range(r->where);
    auto it = first;
    while (it != last && !it->second.resolved->SameAs(*r)) ++it;
    if (it == last) {
      const std::string where = r->where;
      return all->emplace(where, Counted{std::move(r), 1})->second.resolved.get();
    }
    ++it->second.refs;
    shared = it->second.resolved.get();
  }
  // The equal one's holder keeps the same objects: r's is not needed.
  tvmdsoopRelease(r->target.holder);
  return shared;
}

void Release(const Resolved* r) {
  std::unique_ptr<Resolved> last;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [first, end] = all->equal_range(r->where);
    for (auto it = first; it != end; ++it) {
      if (it->second.resolved.get() == r) {
        if (--it->second.refs == 0) {
          last = std::move(it->second.resolved);
          all->erase(it);
        }
        break;
      }
    }
  }
  if (last != nullptr) tvmdsoopRelease(last->target.holder);
}

}  // namespace internal
}  // namespace tvmdsoop
