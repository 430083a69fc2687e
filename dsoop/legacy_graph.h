// legacy_graph.h: whole models of relay.build (TVM 0.8-0.20), run by dsoop's own
// graph executor over the functions of their legacy library.
//
// relay.build gives a library of kernels, a graph (JSON) that says in which
// order to call them on which tensors, and the params. TVM >= 0.22 has no graph
// executor, so this file is one: Go reads and verifies the graph and the params
// (legacy_graph.go) and hands over a plan, which says everything here needs
// already checked; this file lays the tensors over storage as the plan says
// and calls each kernel in order, as TVM's graph_executor.cc does. Plain C, no
// Go: the TF kernels run models through vm.c's pools, which hold instances of
// this (one call at a time each: an instance is the scratch storage of a call).
#ifndef TVMDSOOP_LEGACY_GRAPH_H_
#define TVMDSOOP_LEGACY_GRAPH_H_

#include "legacy.h"

#ifdef __cplusplus
extern "C" {
#endif

// A plan, as Go verified it: every index in range, every kernel a function the
// library exports, every entry's bytes within its storage's.
typedef struct {
  int32_t num_storage;
  const int64_t* storage_bytes;   // the size of each storage, in bytes
  const uint8_t* storage_shared;  // 1: holds params only, filled once, shared by every instance
  int32_t num_entries;            // the tensors of the graph (node_row_ptr's entries)
  const int32_t* entry_storage;
  const DLDataType* entry_dtype;  // as the kernels take them: bool is uint1
  const int32_t* entry_ndim;
  const int64_t* entry_shape;     // every entry's shape, one after another
  int32_t num_ops;
  const char* const* op_func;     // "" for a no-op (__nop: a reshape that shares its storage)
  const int32_t* op_num_args;     // inputs, then outputs
  const int32_t* op_args;         // entry ids, op after op
  const uint8_t* op_flatten;      // 1: the kernel takes its tensors flattened (flatten_data)
  int32_t num_inputs;
  const int32_t* input_entry;
  const char* const* input_name;
  int32_t num_outputs;
  const int32_t* output_entry;
} DsoopGraphSpec;

typedef struct DsoopGraph DsoopGraph;
typedef struct DsoopGraphInstance DsoopGraphInstance;

// Makes the executor of spec over lib's functions, named name (the model's
// function, "default"), with a reference to lib. Copies what it keeps of spec.
int dsoop_graph_create(DsoopLegacyLibrary* lib, const char* name, const DsoopGraphSpec* spec,
                       DsoopGraph** out, DsoopError* err);

// Sets the param of entry to nbytes of data (exactly the entry's bytes),
// before any instance is made: into its shared storage, or kept for each
// instance to copy.
int dsoop_graph_set_param(DsoopGraph* g, int32_t entry, const void* data, int64_t nbytes,
                          DsoopError* err);

void dsoop_graph_destroy(DsoopGraph* g);

const char* dsoop_graph_name(const DsoopGraph* g);
int32_t dsoop_graph_num_inputs(const DsoopGraph* g);

// An instance: the scratch storage and the kernels' arguments of one call.
int dsoop_graph_instance_create(DsoopGraph* g, DsoopGraphInstance** out, DsoopError* err);
void dsoop_graph_instance_destroy(DsoopGraphInstance* inst);

// Runs the graph on inst: the inputs (Tensor objects or DLTensor pointers, on
// the CPU, of the graph's dtypes and shapes, compact) are copied into the
// instance's storage, and the outputs, copied into new tensors, left in
// *result (a Tensor, or an Array of them) for the caller to release.
int dsoop_graph_run(DsoopGraph* g, DsoopGraphInstance* inst, const TVMFFIAny* args,
                    int32_t num_args, TVMFFIAny* result, DsoopError* err);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_LEGACY_GRAPH_H_
