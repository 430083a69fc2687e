// dsoop.h: the C boundary between this project and the TVM-FFI runtime.
//
// libtvm_ffi.so is opened at run time (dlopen, RTLD_GLOBAL) rather than linked, so
// that one op library serves whatever TVM installation the process has, reports a
// clear error when there is none, and makes the TVM-FFI symbols global for the
// TVM modules it loads (TensorFlow loads op libraries RTLD_LOCAL).
//
// Everything here is plain C with no Go call, so the per-call path
// (dsoop_call) is a direct call of the TVM function pointer. Nothing here
// aborts: failures come back as a DsoopError.
#ifndef TVMDSOOP_DSOOP_H_
#define TVMDSOOP_DSOOP_H_

#include <stddef.h>
#include <stdint.h>

// The vendored DLPack header, by its path from this file: a quoted include looks
// beside the including file before any -I folder, so no other dlpack/dlpack.h on
// the include path can stand in for it (cgo puts CGO_CFLAGS, TensorFlow's include
// folder say, before the #cgo folders). c_api.h's <dlpack/dlpack.h> then finds
// the include guard set.
#include "../dlpack/dlpack.h"

// A copy included before this header has set the guard already and kept ours
// out: refused here. The numbers are the vendored header's version; update them
// with it.
#if DLPACK_MAJOR_VERSION != 1 || DLPACK_MINOR_VERSION != 3
#error "dsoop: a dlpack/dlpack.h other than the vendored one (DLPack 1.3) was included first"
#endif

#include <tvm/ffi/c_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// A TVM error, or one of ours, as two malloc'ed strings. Free with dsoop_error_clear.
typedef struct {
  char* kind;     // TVM's error kind ("ValueError", "RuntimeError", ...)
  char* message;  // the message, without a backtrace
} DsoopError;

void dsoop_error_clear(DsoopError* err);

// Fills err with kind and a printf-formatted message; returns -1.
int dsoop_error_set(DsoopError* err, const char* kind, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Moves the error TVM raised on this thread into err; returns -1.
int dsoop_error_take_raised(DsoopError* err);

// The error object TVM raised on this thread, moved out (a new reference, for
// dsoop_object_release), or NULL if none; and one raised again on this thread,
// as a failing TVM function raises it (the caller keeps its reference). For an
// error that crosses threads (parallel.c's workers).
TVMFFIObjectHandle dsoop_error_move_raised(void);
void dsoop_error_raise(TVMFFIObjectHandle error);

// Opens the TVM-FFI library with RTLD_GLOBAL, as dsoop_runtime_init does (the
// same handle), and reads its version with TVMFFIGetVersion, the one entry point
// stable across every version of the C ABI. Nothing else of the library is
// called, so a caller can refuse a runtime of another version before relying on
// its ABI. *file is the file the loader opened (ffi_library may be a bare soname),
// valid for the life of the process: the library is never closed.
int dsoop_runtime_version(const char* ffi_library, TVMFFIVersion* version, const char** file,
                          DsoopError* err);

// Opens the TVM-FFI library (required) and the TVM runtime (optional, may be NULL
// or "") with RTLD_GLOBAL and resolves the entry points. Safe to call again: later
// calls after a success do nothing and return 0. It does not check the version:
// dsoop's Go side calls dsoop_runtime_version first.
int dsoop_runtime_init(const char* ffi_library, const char* runtime_library, DsoopError* err);

// A symbol of the TVM-FFI library (from_runtime 0) or of the TVM runtime
// (from_runtime 1), looked up in that library and its dependencies only; NULL
// when it has none, when no TVM runtime was opened, or before dsoop_runtime_init
// succeeded.
void* dsoop_runtime_symbol(int from_runtime, const char* name);

// The file of the shared object this code was linked into (the op library, or
// the executable), for finding programs installed beside it; "" if unknown.
const char* dsoop_own_file(void);

// Whether the runtime has a global function of that name (a loader a device
// runtime registers, a callback TVM's Python package registers): 1 yes, 0 no,
// -1 on error.
int dsoop_global_exists(const char* name, DsoopError* err);

// Opens a library that extends the runtime by registering functions when loaded
// (TVM's device runtimes, libtvm_runtime_cuda.so) or that one of those needs. Opened
// RTLD_LOCAL, as TVM's Python package does: its symbols stay private to it.
int dsoop_load_extension(const char* path, DsoopError* err);

// A TVM-FFI function with its call resolved once, so a call is one indirect
// call: safe_call(self, ...). That is the function object's own call (self is
// the object); for a function a library exports, the library's symbol that the
// object wraps, called as TVM's library module calls it (self NULL: see
// dsoop_function_use_symbol); for a legacy library's, legacy.c's call with its
// own self, as the object would call it. Holds one reference to the function
// object, which keeps its library loaded.
typedef struct {
  TVMFFIObjectHandle handle;
  TVMFFISafeCallType safe_call;
  void* self;
} DsoopFunction;

// The global function of that name: 1 with a new reference in *out, 0 when
// the runtime has none, -1 on error.
int dsoop_global_function(const char* name, DsoopFunction* out, DsoopError* err);

// Every call of a TVM function goes through here: one indirect call of the
// resolved pointer, with the result set to None first as the ABI asks, and left
// in *result for the caller. 0, or -1 with err filled. Inline, so that the TF
// CPU kernel's per-call path is its own code calling the function pointer.
static inline int dsoop_call(const DsoopFunction* fn, const TVMFFIAny* args, int32_t n,
                             TVMFFIAny* result, DsoopError* err) {
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  if (fn->safe_call(fn->self, args, n, result) != 0) return dsoop_error_take_raised(err);
  return 0;
}

// Loads a shared library as a module through TVM's own loader
// (ffi.Module.load_from_file.so, whatever the file's name). On success *out holds
// a new reference to the module object.
int dsoop_module_load(const char* path, TVMFFIObjectHandle* out, DsoopError* err);

// Of the pointers names (defined by the library loaded from path, which calls
// through them), the index of the first that loading left NULL: TVM's loader fills
// each with a function of TVM's runtime, when the runtime registered one. -1 when
// none is NULL, or when no library is loaded from path.
int32_t dsoop_library_unset_pointer(const char* path, const char* const* names, int32_t num_names);

// The environment variable that keeps TVM's own thread pool for parallel loops
// when set to "tvm" (parallel.c's pool otherwise).
#define DSOOP_THREAD_POOL_ENV "TVMDSOOP_THREAD_POOL"

// Points the parallel-loop hooks of the library loaded from path
// (__TVMBackendParallelLaunch, __TVMBackendParallelBarrier), where TVM's loader
// filled them, at this library's thread pool (parallel.c), unless
// DSOOP_THREAD_POOL_ENV says "tvm". Returns how many it pointed there.
int dsoop_parallel_install(const char* path);

// Whether the dynamic loader lists an object loaded from path (the name dlopen
// was given, which a later dlopen of path would match): 1 yes, 0 no. The walk
// holds the loader's lock, so an object another thread is closing is either
// still listed or gone.
int dsoop_library_registered(const char* path);

// Hands the C heap's free memory back to the system (glibc's malloc_trim; a
// no-op elsewhere). glibc raises its threshold for mmap'ed blocks to the size
// of the largest one freed, so that a model's weights, freed once and loaded
// again (the next version's), come from the heap and stay there when freed.
void dsoop_trim_heap(void);

// Looks a function up in a module (and its imports). Returns 1 when found (out
// holds a new reference), 0 when the module has no such function, -1 on error.
int dsoop_module_get_function(TVMFFIObjectHandle module, const char* name, DsoopFunction* out,
                              DsoopError* err);

// Makes fn, which module gave for name, call the library's exported symbol for
// name (TVM-FFI's "__tvm_ffi_" + name) directly, when module is the library
// module TVM's loader made of the shared library loaded from path and that
// library exports the symbol: TVM's module calls the same symbol, with the same
// arguments, through a trampoline and a lambda of its own. The per-call path of
// the TF kernels then runs no TVM-FFI trampoline. Returns 1 when fn calls the symbol,
// 0 when it is left as it was (any other module, or no such symbol).
int dsoop_function_use_symbol(TVMFFIObjectHandle module, const char* path, const char* name,
                              DsoopFunction* fn);

// Adds a reference to fn and copies it to out.
void dsoop_function_retain(const DsoopFunction* fn, DsoopFunction* out);

// Adds a reference to a module or function object.
void dsoop_object_retain(TVMFFIObjectHandle obj);

// Drops a reference to a module or function object.
void dsoop_object_release(TVMFFIObjectHandle obj);

// Calls fn with packed arguments. Any returned object is released. 0 on success,
// -1 with err filled on failure. The per-call path of the Go binding (goapi.c).
int dsoop_function_call(const DsoopFunction* fn, const TVMFFIAny* args, int32_t num_args,
                        DsoopError* err);

// Calls fn with TVM's current stream for (device_type, device_id) set to stream
// (TVMFFIEnvSetStream), and the previous stream restored afterwards, on failure
// too. TVM kernels launch on that stream, so the call is ordered with the
// caller's other work there and needs no synchronisation. The TF GPU kernel and
// the GPU harness both call TVM through this.
int dsoop_function_call_on_stream(const DsoopFunction* fn, const TVMFFIAny* args,
                                  int32_t num_args, int32_t device_type, int32_t device_id,
                                  void* stream, DsoopError* err);

// Calls fn and leaves what it returned in *result, for the caller to release
// with dsoop_any_release. When device_type is not kDLCPU, TVM's current stream
// for the device is set to stream for the call, as dsoop_function_call_on_stream
// does. The TF kernels call functions that return tensors through this.
int dsoop_function_call_returning(const DsoopFunction* fn, const TVMFFIAny* args,
                                  int32_t num_args, int32_t device_type, int32_t device_id,
                                  void* stream, TVMFFIAny* result, DsoopError* err);

// Releases the object a TVMFFIAny holds, if any, and sets it to None.
void dsoop_any_release(TVMFFIAny* value);

// Wraps a DLPack tensor as a TVM-FFI Tensor object without a copy. On success
// TVM owns `from` and calls its deleter when it drops the last reference (which
// may be long after the call: a function may keep or return it); on failure the
// caller still owns it.
int dsoop_tensor_from_dlpack(DLManagedTensor* from, TVMFFIObjectHandle* out, DsoopError* err);

// A DLPack view of a Tensor object, sharing its memory. The view holds a
// reference to the Tensor, dropped when its deleter is called.
int dsoop_tensor_to_dlpack(TVMFFIObjectHandle tensor, DLManagedTensor** out, DsoopError* err);

// Flattens what a function returned into its tensors, in order: a Tensor, or an
// Array of Tensors and Arrays (nested tuples), depth first. Writes up to max new
// references into out and returns how many tensors there are (which may be more
// than max: then only the first max are written). Returns -1 with err when the
// value holds anything but tensors and arrays.
int dsoop_result_tensors(const TVMFFIAny* result, TVMFFIObjectHandle* out, int max,
                         DsoopError* err);

// A value a function returned, converted to plain C.
typedef struct {
  int32_t type_index;  // kTVMFFINone, kTVMFFIInt, kTVMFFIBool, kTVMFFIFloat or kTVMFFIStr
  int64_t v_int;       // Int and Bool
  double v_float;      // Float
  char* v_str;         // Str (and Bytes, as kTVMFFIStr): malloc'ed, free with free()
  size_t str_len;
} DsoopValue;

// Like dsoop_function_call, and converts the returned value into *out. A value
// of another type (an object, a tensor) is released and reported as an error.
int dsoop_function_call_value(const DsoopFunction* fn, const TVMFFIAny* args, int32_t num_args,
                              DsoopValue* out, DsoopError* err);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_DSOOP_H_
