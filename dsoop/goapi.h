// goapi.h: the C half of dsoop's Go API: what its cgo calls need done in C, on
// top of dsoop.h and vm.h. Go reaches C only through these and the functions of
// those headers.
#ifndef TVMDSOOP_GOAPI_H_
#define TVMDSOOP_GOAPI_H_

#include "dsoop.h"

#ifdef __cplusplus
extern "C" {
#endif

// How many tensors' data pointers a call takes as arguments (dsoop_go_call).
enum { kDirectData = 4 };

// What dsoop_go_call does with the function.
enum {
  kGoCallDiscard = 0,   // dsoop_function_call: the result is released
  kGoCallValue = 1,     // dsoop_function_call_value: the result goes into *value
  kGoCallOnStream = 2,  // dsoop_function_call_on_stream, with device_type, device_id, stream
};

// Completes a frame and calls fn. Go passes the data pointers of the first
// num_direct tensors as d0..d3 (cgo keeps Go memory passed so valid during the
// call, with no pinning), and they are written into the frame's DLTensors here,
// in C. After the call no data pointer is left in the frame: cgo's rules let C
// keep none.
int dsoop_go_call(DsoopFunction fn, const TVMFFIAny* args, int32_t num_args, DLTensor* tensors,
                  int32_t num_tensors, int32_t num_direct, void* d0, void* d1, void* d2, void* d3,
                  int mode, int32_t device_type, int32_t device_id, void* stream,
                  DsoopValue* value, DsoopError* err);

// A Tensor object over d's memory (no copy), with d's shape and strides copied
// into the block of its DLManagedTensor, which TVM frees when it drops the last
// reference. The data pointer comes as an integer: Go pinned it for as long as
// the call's outputs live (VMFunc.Call).
int dsoop_go_tensor(const DLTensor* d, uintptr_t data, TVMFFIObjectHandle* out, DsoopError* err);

// Calls m's deleter, if it has one: how Go drops a DLPack view
// (dsoop_tensor_to_dlpack) it holds.
void dsoop_go_delete_managed(DLManagedTensor* m);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_GOAPI_H_
