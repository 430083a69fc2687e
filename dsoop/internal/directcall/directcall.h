// directcall.h: a C loop of dsoop function calls, the baseline of dsoop's
// per-call benchmarks.
#ifndef TVMDSOOP_DIRECTCALL_H_
#define TVMDSOOP_DIRECTCALL_H_

#include <stdint.h>

#include "dsoop/dsoop.h"

// Calls fn(x, y) iters times on two float32 vectors of n elements in C memory.
int directcall_loop(const DsoopFunction* fn, int64_t n, int64_t iters, DsoopError* err);

#endif  // TVMDSOOP_DIRECTCALL_H_
