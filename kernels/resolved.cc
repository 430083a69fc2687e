// resolved.cc: the process's one Resolved for each function (resolved.h).
#include "kernels/resolved.h"

#include <map>
#include <mutex>
#include <utility>

#include "dsoop/dsoop.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {

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

}  // namespace internal
}  // namespace tvmdsoop
