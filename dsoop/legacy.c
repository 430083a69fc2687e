// legacy.c: libraries built by TVM 0.8-0.20 (see legacy.h).
#define _GNU_SOURCE  // dladdr1, dlinfo
#include "legacy.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct DsoopLegacyLibrary {
  atomic_int refs;
  void* handle;  // from dlopen
  char* name;    // as the user named it, for messages
};

// A function of a legacy library: the self of its TVM-FFI Function.
typedef struct {
  DsoopLegacyLibrary* lib;  // one reference
  LegacyPackedCFunc fn;
  char* name;
} LegacyFunction;

// The TVM-FFI entry points used here, resolved at the first open.
static struct {
  int (*function_create)(void*, TVMFFISafeCallType, void (*)(void*), TVMFFIObjectHandle*);
  void (*error_set_raised_from_cstr)(const char*, const char*);
} ffi;
static pthread_mutex_t ffi_mu = PTHREAD_MUTEX_INITIALIZER;

static int resolve_ffi(DsoopError* err) {
  pthread_mutex_lock(&ffi_mu);
  if (ffi.function_create == NULL) {
    *(void**)(&ffi.function_create) = dsoop_runtime_symbol(0, "TVMFFIFunctionCreate");
    *(void**)(&ffi.error_set_raised_from_cstr) = dsoop_runtime_symbol(0, "TVMFFIErrorSetRaisedFromCStr");
    if (ffi.function_create == NULL || ffi.error_set_raised_from_cstr == NULL) {
      memset(&ffi, 0, sizeof(ffi));
      pthread_mutex_unlock(&ffi_mu);
      return dsoop_error_set(err, "RuntimeError",
                             "the TVM-FFI runtime is not open, or does not export "
                             "TVMFFIFunctionCreate and TVMFFIErrorSetRaisedFromCStr");
    }
  }
  pthread_mutex_unlock(&ffi_mu);
  return 0;
}

// --- the context the library calls back through ----------------------------------

// TVMAPISetLastError: raises the message as a TVM-FFI error, which the call's
// caller takes as it takes any other. Old TVM's frontends read an error kind
// from a leading "ValueError: "; the argument checks TVM generates say
// "Assert fail: <condition>, <what>", which are bad arguments.
static void legacy_set_last_error(const char* msg) {
  if (msg == NULL) msg = "(no message)";
  size_t n = 0;
  while ((msg[n] >= 'A' && msg[n] <= 'Z') || (msg[n] >= 'a' && msg[n] <= 'z')) ++n;
  if (n > 5 && n < 64 && strncmp(msg + n - 5, "Error", 5) == 0 && msg[n] == ':' &&
      msg[n + 1] == ' ') {
    char kind[64];
    memcpy(kind, msg, n);
    kind[n] = '\0';
    ffi.error_set_raised_from_cstr(kind, msg + n + 2);
    return;
  }
  const int assert_fail = strncmp(msg, "Assert fail: ", 13) == 0;
  ffi.error_set_raised_from_cstr(assert_fail ? "ValueError" : "RuntimeError", msg);
}

// TVMBackendGetFuncFromEnv: how a library reaches packed functions that are not
// its own (extern library calls such as cblas, device kernels). mod_node is the
// library's __tvm_module_ctx, which dsoop_legacy_open set to the library.
static int legacy_get_func_from_env(void* mod_node, const char* func_name, void** out) {
  const DsoopLegacyLibrary* lib = (const DsoopLegacyLibrary*)mod_node;
  char msg[1024];
  snprintf(msg, sizeof(msg),
           "%s asks its runtime for the packed function '%s' (TVMBackendGetFuncFromEnv: an "
           "extern call or device code); dsoop calls the functions of libraries of TVM <= 0.20 "
           "but provides no packed functions to them: rebuild the library with TVM >= 0.22",
           lib != NULL ? lib->name : "a library of TVM <= 0.20", func_name != NULL ? func_name : "");
  *out = NULL;
  ffi.error_set_raised_from_cstr("NotImplementedError", msg);
  return -1;
}

// TVMFuncCall: only ever called with what legacy_get_func_from_env returned,
// which is nothing; filled so that no call goes through a NULL pointer.
static int legacy_func_call(void* func, LegacyValue* args, int* type_codes, int num_args,
                            LegacyValue* ret, int* ret_type_code) {
  (void)func, (void)args, (void)type_codes, (void)num_args, (void)ret, (void)ret_type_code;
  ffi.error_set_raised_from_cstr("NotImplementedError",
                                 "TVMFuncCall: dsoop provides no packed functions to libraries "
                                 "of TVM <= 0.20");
  return -1;
}

// The context pointers of TVM 0.8-0.20 (library_module.cc, InitContextFunctions,
// and __tvm_module_ctx), and what fills them: a function here, or one the TVM
// runtime exports with the same signature (TVM 0.27's c_backend_api.h declares
// them as 0.8 did).
typedef struct {
  const char* symbol;
  void* local;           // filled with this, or
  const char* runtime;   // with this function of the TVM runtime
} ContextEntry;

static const ContextEntry kContext[] = {
    {"__TVMAPISetLastError", (void*)legacy_set_last_error, NULL},
    {"__TVMBackendGetFuncFromEnv", (void*)legacy_get_func_from_env, NULL},
    {"__TVMFuncCall", (void*)legacy_func_call, NULL},
    {"__TVMBackendAllocWorkspace", NULL, "TVMBackendAllocWorkspace"},
    {"__TVMBackendFreeWorkspace", NULL, "TVMBackendFreeWorkspace"},
    {"__TVMBackendParallelLaunch", NULL, "TVMBackendParallelLaunch"},
    {"__TVMBackendParallelBarrier", NULL, "TVMBackendParallelBarrier"},
    {"__tvm_module_ctx", NULL, NULL},  // the library itself: see legacy_get_func_from_env
};

// Fills the library's context symbol name. Returns 0, or
// kDsoopLegacyUnsupported or kDsoopLegacyNeedsRuntime with err.
static int fill_context(DsoopLegacyLibrary* lib, struct link_map* own, const char* name,
                        DsoopError* err) {
  const ContextEntry* entry = NULL;
  for (size_t i = 0; i < sizeof(kContext) / sizeof(kContext[0]); ++i) {
    if (strcmp(kContext[i].symbol, name) == 0) entry = &kContext[i];
  }
  if (entry == NULL) {
    dsoop_error_set(err, "ValueError",
                    "%s has the context symbol %s, which dsoop does not know how to fill: "
                    "refusing a library that would call through it",
                    lib->name, name);
    return kDsoopLegacyUnsupported;
  }
  void** slot = (void**)dlsym(lib->handle, name);
  // The loader's lookup searches the library's dependencies too: the slot must be its own.
  Dl_info info;
  struct link_map* where = NULL;
  if (slot == NULL || dladdr1(slot, &info, (void**)&where, RTLD_DL_LINKMAP) == 0 || where != own) {
    dsoop_error_set(err, "ValueError", "%s: its context symbol %s is not its own", lib->name, name);
    return kDsoopLegacyUnsupported;
  }
  void* value = entry->local;
  if (entry->runtime != NULL) {
    value = dsoop_runtime_symbol(1, entry->runtime);
    if (value == NULL) {
      dsoop_error_set(err, "RuntimeError", "%s calls %s (workspace memory, parallel loops)",
                      lib->name, entry->runtime);
      return kDsoopLegacyNeedsRuntime;
    }
  } else if (value == NULL) {
    value = lib;
  }
  *slot = value;
  return 0;
}

void dsoop_legacy_retain(DsoopLegacyLibrary* lib) { atomic_fetch_add(&lib->refs, 1); }

void* dsoop_legacy_symbol(DsoopLegacyLibrary* lib, const char* name) { return dlsym(lib->handle, name); }

void dsoop_legacy_release(DsoopLegacyLibrary* lib) {
  if (lib == NULL || atomic_fetch_sub(&lib->refs, 1) != 1) return;
  dlclose(lib->handle);
  free(lib->name);
  free(lib);
}

int dsoop_legacy_open(const char* path, const char* name, const char* const* context,
                      int num_context, DsoopLegacyLibrary** out, DsoopError* err) {
  if (resolve_ffi(err) != 0) return -1;
  DsoopLegacyLibrary* lib = (DsoopLegacyLibrary*)calloc(1, sizeof(*lib));
  if (lib == NULL) return dsoop_error_set(err, "MemoryError", "out of memory opening %s", name);
  atomic_init(&lib->refs, 1);
  lib->name = strdup(name);
  if (lib->name == NULL) {
    free(lib);
    return dsoop_error_set(err, "MemoryError", "out of memory opening %s", name);
  }
  // RTLD_LOCAL, as old TVM loaded them: nothing of one library is another's.
  lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == NULL) {
    dsoop_error_set(err, "RuntimeError", "cannot load %s: %s", name, dlerror());
    free(lib->name);
    free(lib);
    return -1;
  }
  struct link_map* own = NULL;
  if (dlinfo(lib->handle, RTLD_DI_LINKMAP, &own) != 0 || own == NULL) {
    dsoop_error_set(err, "RuntimeError", "%s: %s", name, dlerror());
    dsoop_legacy_release(lib);
    return -1;
  }
  for (int i = 0; i < num_context; ++i) {
    const int rc = fill_context(lib, own, context[i], err);
    if (rc != 0) {
      dsoop_legacy_release(lib);
      return rc;
    }
  }
  *out = lib;
  return 0;
}

// --- calls -------------------------------------------------------------------------

// The arguments a call converts on the stack; more take the heap.
enum { kStackArgs = 16 };

// Converts one TVM-FFI argument to the legacy convention; -1 (raised) for a type
// that has no counterpart there. A bool tensor is passed through view, a copy of
// its DLTensor with the dtype old TVM gave booleans: uint1, one byte a value
// (DLPack's bool, which TF passes, is kDLBool of 8 bits, same bytes).
static int to_legacy(const LegacyFunction* f, int32_t i, const TVMFFIAny* in, LegacyValue* value,
                     int* code, DLTensor* view) {
  value->v_int64 = in->v_int64;  // every POD payload: the unions share their layout
  switch (in->type_index) {
    case kTVMFFINone: *code = kLegacyNull; value->v_handle = NULL; return 0;
    case kTVMFFIInt: *code = kLegacyInt; return 0;
    // kLegacyInt, not kLegacyBool: every version's integer arguments take it,
    // and TVM 0.18-0.20's boolean arguments take both.
    case kTVMFFIBool: *code = kLegacyInt; return 0;
    case kTVMFFIFloat: *code = kLegacyFloat; return 0;
    case kTVMFFIOpaquePtr: *code = kLegacyOpaqueHandle; return 0;
    case kTVMFFIDataType: *code = kLegacyDataType; return 0;
    case kTVMFFIDevice: *code = kLegacyDevice; return 0;
    case kTVMFFIRawStr: *code = kLegacyStr; return 0;
    // A TVMFFIByteArray is a TVMByteArray: data, then size.
    case kTVMFFIByteArrayPtr: *code = kLegacyBytes; return 0;
    case kTVMFFIDLTensorPtr:
    case kTVMFFITensor: {
      // A Tensor object's DLTensor follows its header.
      DLTensor* t = in->type_index == kTVMFFITensor ? (DLTensor*)((char*)in->v_obj + sizeof(TVMFFIObject))
                                                     : (DLTensor*)in->v_ptr;
      if (t != NULL && t->dtype.code == kDLBool && t->dtype.bits == 8) {
        *view = *t;
        view->dtype.code = kDLUInt;
        view->dtype.bits = 1;
        t = view;
      }
      *code = kLegacyDLTensorHandle;
      value->v_handle = t;
      return 0;
    }
    default: {
      char msg[512];
      snprintf(msg, sizeof(msg),
               "%s of %s: argument %d has TVM-FFI type index %d, which the calling convention "
               "of TVM <= 0.20 cannot pass (tensors, numbers, None, pointers, strings)",
               f->name, f->lib->name, (int)i, (int)in->type_index);
      ffi.error_set_raised_from_cstr("TypeError", msg);
      return -1;
    }
  }
}

// Converts what a legacy function returned; -1 (raised) for objects, which the
// old runtime would have owned.
static int from_legacy(const LegacyFunction* f, const LegacyValue* value, int code,
                       TVMFFIAny* out) {
  out->v_int64 = value->v_int64;
  switch (code) {
    case kLegacyNull: out->type_index = kTVMFFINone; out->v_int64 = 0; return 0;
    case kLegacyInt:
    case kLegacyUInt: out->type_index = kTVMFFIInt; return 0;
    case kLegacyBool: out->type_index = kTVMFFIBool; out->v_int64 = value->v_int64 != 0; return 0;
    case kLegacyFloat: out->type_index = kTVMFFIFloat; return 0;
    case kLegacyOpaqueHandle: out->type_index = kTVMFFIOpaquePtr; return 0;
    case kLegacyDataType: out->type_index = kTVMFFIDataType; return 0;
    case kLegacyDevice: out->type_index = kTVMFFIDevice; return 0;
    default: {
      out->type_index = kTVMFFINone;
      out->v_int64 = 0;
      char msg[512];
      snprintf(msg, sizeof(msg),
               "%s of %s returned a value of legacy type code %d, which dsoop does not take "
               "over from a library of TVM <= 0.20 (numbers, None and pointers only)",
               f->name, f->lib->name, code);
      ffi.error_set_raised_from_cstr("TypeError", msg);
      return -1;
    }
  }
}

// The call of a legacy function as a TVM-FFI safe call.
static int legacy_call(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  const LegacyFunction* f = (const LegacyFunction*)self;
  LegacyValue stack_values[kStackArgs];
  int stack_codes[kStackArgs];
  DLTensor stack_views[kStackArgs];
  LegacyValue* values = stack_values;
  int* codes = stack_codes;
  DLTensor* views = stack_views;
  if (num_args > kStackArgs) {
    values = (LegacyValue*)malloc(sizeof(LegacyValue) * (size_t)num_args);
    codes = (int*)malloc(sizeof(int) * (size_t)num_args);
    views = (DLTensor*)malloc(sizeof(DLTensor) * (size_t)num_args);
    if (values == NULL || codes == NULL || views == NULL) {
      free(values);
      free(codes);
      free(views);
      ffi.error_set_raised_from_cstr("MemoryError", "out of memory for the arguments of a call");
      return -1;
    }
  }
  int rc = 0;
  for (int32_t i = 0; i < num_args && rc == 0; ++i) {
    rc = to_legacy(f, i, &args[i], &values[i], &codes[i], &views[i]);
  }
  if (rc == 0) {
    LegacyValue ret = {0};
    int ret_code = kLegacyNull;
    // The old runtime passed no resource handle to library functions either.
    rc = f->fn(values, codes, num_args, &ret, &ret_code, NULL) == 0 ? 0 : -1;
    if (rc == 0) rc = from_legacy(f, &ret, ret_code, result);
  }
  if (values != stack_values) {
    free(values);
    free(codes);
    free(views);
  }
  return rc;
}

static void legacy_function_delete(void* self) {
  LegacyFunction* f = (LegacyFunction*)self;
  dsoop_legacy_release(f->lib);
  free(f->name);
  free(f);
}

int dsoop_legacy_get_function(DsoopLegacyLibrary* lib, const char* name, DsoopFunction* out,
                              DsoopError* err) {
  void* symbol = dlsym(lib->handle, name);
  if (symbol == NULL) {
    return dsoop_error_set(err, "RuntimeError", "%s: no symbol %s: %s", lib->name, name, dlerror());
  }
  LegacyFunction* f = (LegacyFunction*)calloc(1, sizeof(*f));
  if (f != NULL) f->name = strdup(name);
  if (f == NULL || f->name == NULL) {
    free(f);
    return dsoop_error_set(err, "MemoryError", "out of memory looking up %s", name);
  }
  *(void**)(&f->fn) = symbol;
  f->lib = lib;
  dsoop_legacy_retain(lib);
  TVMFFIObjectHandle handle = NULL;
  if (ffi.function_create(f, legacy_call, legacy_function_delete, &handle) != 0) {
    legacy_function_delete(f);
    return dsoop_error_take_raised(err);
  }
  // Called as the object would call it (tvm-ffi's ExternCFunctionObjImpl),
  // without its trampoline; the object owns f.
  out->handle = handle;
  out->safe_call = legacy_call;
  out->self = f;
  return 0;
}
