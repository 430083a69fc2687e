// legacy.h: libraries built by TVM 0.8-0.20, whose functions speak the legacy
// calling convention, behind the same DsoopFunction as every other function.
//
// Such a library exports each function under its own name as a
// TVMBackendPackedCFunc:
//   int f(TVMValue* args, int* type_codes, int num_args, TVMValue* ret,
//         int* ret_type_code, void* resource_handle)
// and calls back into the runtime that loaded it through context pointers
// (__TVMAPISetLastError, __TVMBackendAllocWorkspace, __TVMBackendParallelLaunch,
// ...) that the old runtime filled at load. Today's runtime neither finds those
// functions (it looks for __tvm_ffi_<name>) nor fills all of those pointers, so
// this file loads such a library itself, fills every pointer with an
// implementation over today's runtime, and wraps each function as a TVM-FFI
// Function whose call converts the arguments: the TF kernels and the Go API call
// it as they call any other.
#ifndef TVMDSOOP_LEGACY_H_
#define TVMDSOOP_LEGACY_H_

#include "dsoop.h"

#ifdef __cplusplus
extern "C" {
#endif

// The legacy calling convention, as TVM 0.8-0.20's c_runtime_api.h and
// c_backend_api.h define it.
typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
  const char* v_str;
  DLDataType v_type;
  DLDevice v_device;
} LegacyValue;

// Type codes (TVMArgTypeCode). Tensors come as kLegacyDLTensorHandle: the
// functions TVM generates accept it, as they accept 3, 4 and 13, for a buffer.
enum {
  kLegacyInt = 0,
  kLegacyUInt = 1,
  kLegacyFloat = 2,
  kLegacyOpaqueHandle = 3,
  kLegacyNull = 4,
  kLegacyDataType = 5,
  kLegacyDevice = 6,
  kLegacyDLTensorHandle = 7,
  kLegacyStr = 11,
  kLegacyBytes = 12,
  kLegacyBool = 15,  // TVM 0.18 on (make_packed_api.cc); earlier versions pass booleans as kLegacyInt
};

typedef int (*LegacyPackedCFunc)(LegacyValue* args, int* type_codes, int num_args,
                                 LegacyValue* ret, int* ret_type_code, void* resource_handle);

// A loaded legacy library, reference-counted: the Go module holds one reference,
// every function taken from it another, and the library is closed with the last.
typedef struct DsoopLegacyLibrary DsoopLegacyLibrary;

// What dsoop_legacy_open returns, besides 0 and -1, with err filled: the
// library needs the TVM runtime (libtvm_runtime.so: workspace memory, the thread
// pool) and none was opened; or it has a context symbol that dsoop cannot fill.
enum { kDsoopLegacyNeedsRuntime = -2, kDsoopLegacyUnsupported = -3 };

// Opens the library at path (the verified copy) and fills its context pointers,
// the num_context symbols of context (the library's data symbols that name one:
// __TVM..., __tvm_module_ctx). name is the library as the user named it, for
// messages. A context symbol this file does not know is an error
// (kDsoopLegacyUnsupported), and so is one the runtime cannot fill
// (kDsoopLegacyNeedsRuntime): the library would call through a NULL pointer. dsoop_runtime_init must have succeeded.
int dsoop_legacy_open(const char* path, const char* name, const char* const* context,
                      int num_context, DsoopLegacyLibrary** out, DsoopError* err);

// The function symbol of that name as a TVM-FFI Function (a new reference in
// *out). The caller has checked that the library exports a function of that
// name (its ELF symbol table): the loader's lookup also finds data and the
// symbols of the library's dependencies.
int dsoop_legacy_get_function(DsoopLegacyLibrary* lib, const char* name, DsoopFunction* out,
                              DsoopError* err);

// Adds a reference to the library; dsoop_legacy_release drops one.
void dsoop_legacy_retain(DsoopLegacyLibrary* lib);
void dsoop_legacy_release(DsoopLegacyLibrary* lib);

// The library's symbol of that name (dlsym: the caller has checked, from the
// ELF symbol table, that the library exports a function of that name), or NULL.
void* dsoop_legacy_symbol(DsoopLegacyLibrary* lib, const char* name);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_LEGACY_H_
