// vm.h: whole models, the Relax VM executables of tvm.compile + export_library.
//
// A model's entry points (main, forward, ...) are not symbols of its library:
// they exist only inside a VM instance made from the executable the library
// holds. An instance holds registers and per-call state, so it serves one call
// at a time; a pool keeps instances of one executable on one device and lends
// them to calls, making them lazily up to a bound. Plain C, no Go: the kernels
// call models through this with no Go on the path.
#ifndef TVMDSOOP_VM_H_
#define TVMDSOOP_VM_H_

#include "dsoop.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct DsoopVMPool DsoopVMPool;

// Whether a loaded module holds a Relax VM executable (it has
// vm_load_executable): 1 yes, 0 no, -1 on error.
int dsoop_module_is_vm(TVMFFIObjectHandle module, DsoopError* err);

// A pool of VM instances of the executable in module, initialised for the
// device (with the CPU too, for shape computations; TVM's pooled allocator on
// each), holding at most max_instances. One instance is made now, so that an
// executable that cannot run on the device fails here. The pool holds a
// reference to the module.
int dsoop_vm_pool_create(TVMFFIObjectHandle module, int32_t device_type, int32_t device_id,
                         int32_t max_instances, DsoopVMPool** out, DsoopError* err);

// A pool of instances of graph, a relay.build model's executor on the CPU
// (legacy_graph.h), which it takes over (and frees on failure too). Its one
// function is the graph's name, and takes the graph's inputs.
typedef struct DsoopGraph DsoopGraph;
int dsoop_vm_pool_create_graph(DsoopGraph* graph, int32_t max_instances, DsoopVMPool** out,
                               DsoopError* err);

// Frees the pool and its instances. No call may be in flight.
void dsoop_vm_pool_destroy(DsoopVMPool* pool);

// The number of instances made so far (at most max_instances).
int32_t dsoop_vm_pool_size(DsoopVMPool* pool);

// Makes function `name` callable through the pool, as *index, and gives its
// arity (number of parameters). Returns 1, 0 when the executable has no VM
// function of that name, -1 on error.
int dsoop_vm_pool_function(DsoopVMPool* pool, const char* name, int32_t* index,
                           int64_t* arity, DsoopError* err);

// Calls function `index` on an instance lent by the pool (waiting for one when
// all are busy and no more may be made). The arguments must be Tensor objects
// (dsoop_tensor_from_dlpack), not DLTensor pointers. What the function returned
// is left in *result for the caller to release (dsoop_any_release). For a pool
// on a GPU, TVM's current stream for the device is set to stream for the call.
int dsoop_vm_call(DsoopVMPool* pool, int32_t index, const TVMFFIAny* args, int32_t num_args,
                  void* stream, TVMFFIAny* result, DsoopError* err);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_VM_H_
