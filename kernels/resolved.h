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
           target.arity == o.target.arity;  // not the holder: each resolve has its own
  }
};

// The process's one Resolved for each function of a loaded library (dsoop gives
// every lookup of it the same object): the kernels of the function point to it,
// so what their calls read of it stays in cache however many kernels there are.
// Each call hands out one reference, for the caller to give back with Release;
// r's holder is released when an equal Resolved is there already.
const Resolved* Shared(std::unique_ptr<Resolved> r);

// Gives back a reference from Shared. With the last, the Resolved is freed and
// its holder released (tvmdsoopRelease): the library is unloaded if nothing
// else uses it. Calls into Go: not with a lock held that Go's side may wait on.
void Release(const Resolved* r);

}  // namespace internal
}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_RESOLVED_H_
