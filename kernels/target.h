// target.h: what a kernel calls, as Go resolves it for the C++ kernels
// (tvmdsoopResolve in kernels.go): a plain function, or a function of a whole
// model (a Relax VM executable or relay.build graph) with the pool of VM instances that runs it;
// and what keeps them valid, given back with tvmdsoopRelease(holder).
#ifndef TVMDSOOP_KERNELS_TARGET_H_
#define TVMDSOOP_KERNELS_TARGET_H_

#include <stdint.h>

#include "dsoop/dsoop.h"
#include "dsoop/vm.h"

// A relay.build model given as three files: its graph JSON and params, with
// the SHA-256 (hex) each must have ("": any), besides its library.
typedef struct {
  const char* graph;
  const char* graph_sha256;
  const char* params;
  const char* params_sha256;
} TvmdsoopGraphFiles;

typedef struct {
  DsoopFunction fn;     // a plain function; fn.handle is NULL for a model's
  DsoopVMPool* pool;    // a model's function: its pool, and its index there
  int32_t vm_index;
  int64_t arity;        // the model function's number of inputs; -1 for plain functions
  uintptr_t holder;     // a Go handle to the library and function kept for this target
} TvmdsoopTarget;

#endif  // TVMDSOOP_KERNELS_TARGET_H_
