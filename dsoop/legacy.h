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

// Drops a reference to the library.
void dsoop_legacy_release(DsoopLegacyLibrary* lib);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_LEGACY_H_
