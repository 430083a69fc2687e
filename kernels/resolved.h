// resolved.h: a function resolved from one library (Resolved), and the one
// Resolved the process keeps for each function, shared by all its kernels.
#ifndef TVMDSOOP_KERNELS_RESOLVED_H_
#define TVMDSOOP_KERNELS_RESOLVED_H_

#include <memory>
#include <string>

#include "kernels/target.h"

namespace tvmdsoop {
// Hidden from the op library's dynamic symbols: nothing here is its interface.
namespace internal __attribute__((visibility("hidden"))) {

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
const Resolved* Shared(std::unique_ptr<Resolved> r);

}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_RESOLVED_H_
