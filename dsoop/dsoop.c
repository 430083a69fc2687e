// dsoop.c: opens the TVM-FFI runtime and calls TVM functions (see dsoop.h).
#define _GNU_SOURCE  // dladdr, dlinfo, sched_getaffinity
#include "dsoop.h"

#include <tvm/ffi/extra/c_env_api.h>

#include <dlfcn.h>
#include <link.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The TVM-FFI C ABI entry points this file uses, resolved from libtvm_ffi.so.
static struct {
  int (*function_get_global)(const TVMFFIByteArray*, TVMFFIObjectHandle*);
  int (*object_inc_ref)(TVMFFIObjectHandle);
  int (*object_dec_ref)(TVMFFIObjectHandle);
  void (*error_move_from_raised)(TVMFFIObjectHandle*);
  void (*error_set_raised)(TVMFFIObjectHandle);
  int (*env_set_stream)(int32_t, int32_t, TVMFFIStreamHandle, TVMFFIStreamHandle*);
  int (*tensor_from_dlpack)(DLManagedTensor*, int32_t, int32_t, TVMFFIObjectHandle*);
  int (*tensor_to_dlpack)(TVMFFIObjectHandle, DLManagedTensor**);
  DsoopFunction load_shared_library;  // ffi.Module.load_from_file.so
  DsoopFunction module_get_function;  // ffi.ModuleGetFunction
  DsoopFunction module_get_kind;      // ffi.ModuleGetKind; handle NULL where the runtime has none
} api;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int ready;  // guarded by init_mu
// The libraries dsoop_runtime_init opened (runtime_handle NULL when no TVM
// runtime was given), for dsoop_runtime_symbol. Written before ready is set.
static void* ffi_handle;
static void* runtime_handle;

static char* copy_bytes(const char* data, size_t size) {
  char* s = (char*)malloc(size + 1);
  if (s != NULL) {
    memcpy(s, data, size);
    s[size] = '\0';
  }
  return s;
}

int dsoop_error_set(DsoopError* err, const char* kind, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  err->kind = copy_bytes(kind, strlen(kind));
  err->message = copy_bytes(buf, strlen(buf));
  return -1;
}

void dsoop_error_clear(DsoopError* err) {
  free(err->kind);
  free(err->message);
  err->kind = NULL;
  err->message = NULL;
}

// The payload of an object follows its header (c_api.h: TVMFFIObject).
static void* object_cell(TVMFFIObjectHandle obj) { return (char*)obj + sizeof(TVMFFIObject); }

// Moves the error TVM raised on this thread into err.
static int take_raised_error(DsoopError* err) {
  TVMFFIObjectHandle e = NULL;
  api.error_move_from_raised(&e);
  if (e == NULL) return dsoop_error_set(err, "RuntimeError", "TVM reported a failure but raised no error");
  const TVMFFIErrorCell* cell = (const TVMFFIErrorCell*)object_cell(e);
  err->kind = copy_bytes(cell->kind.data, cell->kind.size);
  err->message = copy_bytes(cell->message.data, cell->message.size);
  api.object_dec_ref(e);
  return -1;
}

int dsoop_error_take_raised(DsoopError* err) { return take_raised_error(err); }

TVMFFIObjectHandle dsoop_error_move_raised(void) {
  TVMFFIObjectHandle e = NULL;
  api.error_move_from_raised(&e);
  return e;
}

void dsoop_error_raise(TVMFFIObjectHandle error) { api.error_set_raised(error); }

// The call pointer of a function object, from its cell.
static TVMFFISafeCallType safe_call_of(TVMFFIObjectHandle fn) {
  return ((const TVMFFIFunctionCell*)object_cell(fn))->safe_call;
}

static int get_global(const char* name, DsoopFunction* out, DsoopError* err) {
  TVMFFIByteArray bytes = {name, strlen(name)};
  if (api.function_get_global(&bytes, &out->handle) != 0) return take_raised_error(err);
  if (out->handle == NULL) {
    return dsoop_error_set(err, "RuntimeError", "the TVM-FFI runtime has no global function %s", name);
  }
  out->safe_call = safe_call_of(out->handle);
  out->self = out->handle;
  return 0;
}

int dsoop_runtime_version(const char* ffi_library, TVMFFIVersion* version, const char** file,
                          DsoopError* err) {
  *file = ffi_library;
  // Never closed, like dsoop_runtime_init's handle: this is the same one.
  void* ffi = dlopen(ffi_library, RTLD_NOW | RTLD_GLOBAL);
  if (ffi == NULL) {
    return dsoop_error_set(err, "RuntimeError", "cannot open the TVM-FFI runtime: %s", dlerror());
  }
  struct link_map* map = NULL;
  if (dlinfo(ffi, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL &&
      map->l_name[0] != '\0') {
    *file = map->l_name;
  }
  void (*get_version)(TVMFFIVersion*) = NULL;
  *(void**)(&get_version) = dlsym(ffi, "TVMFFIGetVersion");
  if (get_version == NULL) {
    return dsoop_error_set(err, "RuntimeError",
                           "%s does not export TVMFFIGetVersion: not a TVM-FFI runtime", *file);
  }
  get_version(version);
  return 0;
}

// TVM's thread pool settings, where the user set none, for a pool that runs
// beside TensorFlow's threads. TVM reads them from the environment only (when a
// calling thread's pool is made; the spin count once per process), so they are
// set before libtvm_runtime.so can make a pool. TVM's own defaults are made for
// a process of its own: half the online CPUs (1 of 2 here: parallel loops ran
// on one core), workers spinning 300,000 times on the CPUs TF's threads need
// between calls, and the calling TF thread pinned to the first cores, which
// confines every TF thread that calls TVM to the same few. Instead: as many
// threads as the process may use (TF's intra-op default), none pinned, and
// idle workers that spin DSOOP_SPIN_COUNT times before they sleep. Each spin
// is a sched_yield (0.4 us here), which gives the CPU to any TF thread that
// is ready: about 80 us, enough to stay awake across the gaps between one
// model call's kernels (a sleeping worker costs a futex wake at every
// parallel loop: 0 made a transformer block at batch 1 take 290 us a call
// instead of 140), short enough to be asleep when TF's next kernels run.
// docs/compiler.md ("Threads") says how to size them for a server that runs
// several calls at once.
#define DSOOP_SPIN_COUNT "200"

static void default_tvm_thread_settings(void) {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) {
    char count[16];
    snprintf(count, sizeof(count), "%d", CPU_COUNT(&cpus));
    setenv("TVM_NUM_THREADS", count, /*overwrite=*/0);
  }
  setenv("TVM_THREAD_POOL_SPIN_COUNT", DSOOP_SPIN_COUNT, 0);
  setenv("TVM_BIND_THREADS", "0", 0);
}

#define RESOLVE(field, symbol)                                                           \
  do {                                                                                   \
    *(void**)(&api.field) = dlsym(ffi, symbol);                                          \
    if (api.field == NULL) {                                                             \
      dsoop_error_set(err, "RuntimeError", "%s does not export %s: not a TVM-FFI runtime",     \
                ffi_library, symbol);                                                    \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

int dsoop_runtime_init(const char* ffi_library, const char* runtime_library, DsoopError* err) {
  pthread_mutex_lock(&init_mu);
  if (ready) {
    pthread_mutex_unlock(&init_mu);
    return 0;
  }
  // The handles are never closed: TVM modules keep pointers into these libraries.
  void* ffi = dlopen(ffi_library, RTLD_NOW | RTLD_GLOBAL);
  if (ffi == NULL) {
    dsoop_error_set(err, "RuntimeError", "cannot open the TVM-FFI runtime: %s", dlerror());
    goto fail;
  }
  RESOLVE(function_get_global, "TVMFFIFunctionGetGlobal");
  RESOLVE(object_inc_ref, "TVMFFIObjectIncRef");
  RESOLVE(object_dec_ref, "TVMFFIObjectDecRef");
  RESOLVE(error_move_from_raised, "TVMFFIErrorMoveFromRaised");
  RESOLVE(error_set_raised, "TVMFFIErrorSetRaised");
  RESOLVE(env_set_stream, "TVMFFIEnvSetStream");
  RESOLVE(tensor_from_dlpack, "TVMFFITensorFromDLPack");
  RESOLVE(tensor_to_dlpack, "TVMFFITensorToDLPack");
  // libtvm_runtime.so fills the backend hooks (__TVMBackendParallelLaunch, workspace
  // allocation, ...) that tvm.compile'd modules call back through.
  default_tvm_thread_settings();
  void* runtime = NULL;
  if (runtime_library != NULL && runtime_library[0] != '\0' &&
      (runtime = dlopen(runtime_library, RTLD_NOW | RTLD_GLOBAL)) == NULL) {
    dsoop_error_set(err, "RuntimeError", "cannot open the TVM runtime: %s", dlerror());
    goto fail;
  }
  // TVM's own loader for shared libraries, the one ffi.ModuleLoadFromFile picks
  // for a ".so" name. Called directly, so that the file name does not decide:
  // SavedModel assets may be renamed ("lib.so_1"), and sonames carry versions.
  if (get_global("ffi.Module.load_from_file.so", &api.load_shared_library, err) != 0) goto fail;
  if (get_global("ffi.ModuleGetFunction", &api.module_get_function, err) != 0) goto fail;
  // Optional: without it, functions are called through their objects.
  DsoopError no_kind = {NULL, NULL};
  if (get_global("ffi.ModuleGetKind", &api.module_get_kind, &no_kind) != 0) {
    api.module_get_kind.handle = NULL;
    dsoop_error_clear(&no_kind);
  }
  ffi_handle = ffi;
  runtime_handle = runtime;
  ready = 1;
  pthread_mutex_unlock(&init_mu);
  return 0;
fail:
  memset(&api, 0, sizeof(api));
  pthread_mutex_unlock(&init_mu);
  return -1;
}

void* dsoop_runtime_symbol(int from_runtime, const char* name) {
  pthread_mutex_lock(&init_mu);
  void* handle = !ready ? NULL : from_runtime ? runtime_handle : ffi_handle;
  pthread_mutex_unlock(&init_mu);
  return handle == NULL ? NULL : dlsym(handle, name);
}

int dsoop_global_function(const char* name, DsoopFunction* out, DsoopError* err) {
  TVMFFIByteArray bytes = {name, strlen(name)};
  out->handle = NULL;
  if (api.function_get_global(&bytes, &out->handle) != 0) return take_raised_error(err);
  if (out->handle == NULL) return 0;
  out->safe_call = safe_call_of(out->handle);
  out->self = out->handle;
  return 1;
}

int dsoop_global_exists(const char* name, DsoopError* err) {
  TVMFFIByteArray bytes = {name, strlen(name)};
  TVMFFIObjectHandle fn = NULL;
  if (api.function_get_global(&bytes, &fn) != 0) return take_raised_error(err);
  if (fn == NULL) return 0;
  api.object_dec_ref(fn);
  return 1;
}

const char* dsoop_own_file(void) {
  Dl_info info;
  if (dladdr((void*)dsoop_own_file, &info) == 0 || info.dli_fname == NULL) return "";
  return info.dli_fname;
}

int dsoop_load_extension(const char* path, DsoopError* err) {
  // Never closed, like the runtime: modules keep pointers into it.
  if (dlopen(path, RTLD_NOW | RTLD_LOCAL) == NULL) {
    return dsoop_error_set(err, "RuntimeError", "%s", dlerror());
  }
  return 0;
}

static void release_any(TVMFFIAny* value) {
  if (value->type_index >= kTVMFFIStaticObjectBegin && value->v_obj != NULL) {
    api.object_dec_ref(value->v_obj);
  }
}

int dsoop_module_load(const char* path, TVMFFIObjectHandle* out, DsoopError* err) {
  TVMFFIAny args[2] = {{0}, {0}};
  args[0].type_index = kTVMFFIRawStr;
  args[0].v_c_str = path;
  args[1].type_index = kTVMFFIRawStr;
  args[1].v_c_str = "so";
  TVMFFIAny result;
  if (dsoop_call(&api.load_shared_library, args, 2, &result, err) != 0) return -1;
  if (result.type_index != kTVMFFIModule) {
    release_any(&result);
    return dsoop_error_set(err, "TypeError", "loading %s did not give a module", path);
  }
  *out = result.v_obj;
  return 0;
}

int32_t dsoop_library_unset_pointer(const char* path, const char* const* names, int32_t num_names) {
  // Loaded already (a module holds it), so this only finds its handle.
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (library == NULL) return -1;
  int32_t unset = -1;
  for (int32_t i = 0; i < num_names && unset < 0; ++i) {
    // The library defines each name: the lookup finds its own before any dependency's.
    void* const* pointer = (void* const*)dlsym(library, names[i]);
    if (pointer != NULL && *pointer == NULL) unset = i;
  }
  dlclose(library);
  return unset;
}

// dl_iterate_phdr's callback: stops the walk at the object loaded from path.
static int loaded_from(struct dl_phdr_info* info, size_t size, void* path) {
  (void)size;
  return info->dlpi_name != NULL && strcmp(info->dlpi_name, (const char*)path) == 0;
}

int dsoop_library_registered(const char* path) {
  // Not dlopen(RTLD_NOLOAD): glibc would open the path to compare its file when
  // no name matches, and on a match add a reference to drop again.
  return dl_iterate_phdr(loaded_from, (void*)path) != 0;
}

void dsoop_trim_heap(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

int dsoop_module_get_function(TVMFFIObjectHandle module, const char* name, DsoopFunction* out,
                              DsoopError* err) {
  TVMFFIAny args[3] = {{0}, {0}, {0}};
  args[0].type_index = kTVMFFIModule;
  args[0].v_obj = module;
  args[1].type_index = kTVMFFIRawStr;
  args[1].v_c_str = name;
  args[2].type_index = kTVMFFIBool;
  args[2].v_int64 = 1;  // query imports too
  TVMFFIAny result;
  if (dsoop_call(&api.module_get_function, args, 3, &result, err) != 0) return -1;
  if (result.type_index == kTVMFFINone) return 0;
  if (result.type_index != kTVMFFIFunction) {
    release_any(&result);
    return dsoop_error_set(err, "TypeError", "ffi.ModuleGetFunction(%s) did not return a function", name);
  }
  out->handle = result.v_obj;
  out->safe_call = safe_call_of(result.v_obj);
  out->self = result.v_obj;
  return 1;
}

// Whether module is a library module ("library" is TVM-FFI's LibraryModuleObj::kind).
static int is_library_module(TVMFFIObjectHandle module) {
  if (api.module_get_kind.handle == NULL) return 0;
  TVMFFIAny arg = {0};
  arg.type_index = kTVMFFIModule;
  arg.v_obj = module;
  DsoopValue kind;
  DsoopError err = {NULL, NULL};
  if (dsoop_function_call_value(&api.module_get_kind, &arg, 1, &kind, &err) != 0) {
    dsoop_error_clear(&err);
    return 0;
  }
  static const char library[] = "library";
  const int is = kind.type_index == kTVMFFIStr && kind.v_str != NULL &&
                 kind.str_len == sizeof(library) - 1 && memcmp(kind.v_str, library, kind.str_len) == 0;
  free(kind.v_str);
  return is;
}

int dsoop_function_use_symbol(TVMFFIObjectHandle module, const char* path, const char* name,
                              DsoopFunction* fn) {
  // A library module's GetFunction looks the symbol up in its own library
  // before any import, and wraps it in an object that calls it with self NULL
  // (tvm-ffi's library_module.cc): finding the symbol there finds what the
  // object calls.
  if (!is_library_module(module)) return 0;
  // The library is loaded (the module holds it), so this only finds its handle;
  // the reference it adds is dropped at once, the module's keeps it loaded.
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (library == NULL) return 0;
  char symbol[512];
  const int len = snprintf(symbol, sizeof(symbol), "__tvm_ffi_%s", name);
  void* address = len > 0 && (size_t)len < sizeof(symbol) ? dlsym(library, symbol) : NULL;
  dlclose(library);
  if (address == NULL) return 0;
  *(void**)(&fn->safe_call) = address;
  fn->self = NULL;
  return 1;
}

void dsoop_function_retain(const DsoopFunction* fn, DsoopFunction* out) {
  api.object_inc_ref(fn->handle);
  *out = *fn;
}

void dsoop_object_retain(TVMFFIObjectHandle obj) {
  if (obj != NULL) api.object_inc_ref(obj);
}

void dsoop_object_release(TVMFFIObjectHandle obj) {
  if (obj != NULL) api.object_dec_ref(obj);
}

int dsoop_function_call(const DsoopFunction* fn, const TVMFFIAny* args, int32_t num_args,
                        DsoopError* err) {
  TVMFFIAny result;
  if (dsoop_call(fn, args, num_args, &result, err) != 0) return -1;
  release_any(&result);
  return 0;
}

// Calls fn, leaving its result in *result, with TVM's current stream for the
// device set to stream for the call and the previous one restored after, on
// failure too.
static int call_on_stream(const DsoopFunction* fn, const TVMFFIAny* args, int32_t num_args,
                          int32_t device_type, int32_t device_id, void* stream,
                          TVMFFIAny* result, DsoopError* err) {
  TVMFFIStreamHandle previous = NULL;
  if (api.env_set_stream(device_type, device_id, stream, &previous) != 0) {
    return take_raised_error(err);
  }
  const int rc = dsoop_call(fn, args, num_args, result, err);
  TVMFFIStreamHandle ignored = NULL;
  if (api.env_set_stream(device_type, device_id, previous, &ignored) != 0) {
    if (rc == 0) {
      release_any(result);
      return take_raised_error(err);
    }
    // The call's error is the one to report; drop the restore's.
    DsoopError restore_err = {NULL, NULL};
    take_raised_error(&restore_err);
    dsoop_error_clear(&restore_err);
  }
  return rc;
}

int dsoop_function_call_on_stream(const DsoopFunction* fn, const TVMFFIAny* args,
                                  int32_t num_args, int32_t device_type, int32_t device_id,
                                  void* stream, DsoopError* err) {
  TVMFFIAny result;
  if (call_on_stream(fn, args, num_args, device_type, device_id, stream, &result, err) != 0) {
    return -1;
  }
  release_any(&result);
  return 0;
}

int dsoop_function_call_returning(const DsoopFunction* fn, const TVMFFIAny* args,
                                  int32_t num_args, int32_t device_type, int32_t device_id,
                                  void* stream, TVMFFIAny* result, DsoopError* err) {
  if (device_type == kDLCPU) return dsoop_call(fn, args, num_args, result, err);
  return call_on_stream(fn, args, num_args, device_type, device_id, stream, result, err);
}

void dsoop_any_release(TVMFFIAny* value) {
  release_any(value);
  value->type_index = kTVMFFINone;
  value->v_int64 = 0;
}

int dsoop_tensor_from_dlpack(DLManagedTensor* from, TVMFFIObjectHandle* out, DsoopError* err) {
  // No alignment or contiguity demanded here: the callers check both themselves,
  // with errors that name the argument.
  if (api.tensor_from_dlpack(from, 0, 0, out) != 0) return take_raised_error(err);
  return 0;
}

int dsoop_tensor_to_dlpack(TVMFFIObjectHandle tensor, DLManagedTensor** out, DsoopError* err) {
  if (api.tensor_to_dlpack(tensor, out) != 0) return take_raised_error(err);
  return 0;
}

// Appends the tensors of value to out (up to max), depth first; returns the
// running count, or -1 with err on a value that is neither a tensor nor an array.
static int collect_tensors(const TVMFFIAny* value, TVMFFIObjectHandle* out, int max, int count,
                           int depth, DsoopError* err) {
  if (value->type_index == kTVMFFITensor) {
    if (count < max) {
      api.object_inc_ref(value->v_obj);
      out[count] = value->v_obj;
    }
    return count + 1;
  }
  if (value->type_index == kTVMFFIArray && depth < 64) {
    // An Array's cell (TVMFFISeqCell) follows its header: data, then size.
    const TVMFFISeqCell* seq = (const TVMFFISeqCell*)object_cell(value->v_obj);
    const TVMFFIAny* items = (const TVMFFIAny*)seq->data;
    for (int64_t i = 0; i < seq->size && count >= 0; ++i) {
      count = collect_tensors(&items[i], out, max, count, depth + 1, err);
    }
    return count;
  }
  dsoop_error_set(err, "TypeError", "the function returned a value of type index %d where tensors "
            "(or tuples of them) were expected", (int)value->type_index);
  return -1;
}

int dsoop_result_tensors(const TVMFFIAny* result, TVMFFIObjectHandle* out, int max,
                         DsoopError* err) {
  for (int i = 0; i < max; ++i) out[i] = NULL;
  const int count = collect_tensors(result, out, max, 0, 0, err);
  if (count < 0) {
    // Drop the references taken before the bad value.
    for (int i = 0; i < max; ++i) {
      if (out[i] != NULL) api.object_dec_ref(out[i]);
      out[i] = NULL;
    }
  }
  return count;
}

int dsoop_function_call_value(const DsoopFunction* fn, const TVMFFIAny* args, int32_t num_args,
                              DsoopValue* out, DsoopError* err) {
  TVMFFIAny result;
  memset(out, 0, sizeof(*out));
  if (dsoop_call(fn, args, num_args, &result, err) != 0) return -1;
  int rc = 0;
  switch (result.type_index) {
    case kTVMFFINone:
      out->type_index = kTVMFFINone;
      break;
    case kTVMFFIInt:
    case kTVMFFIBool:
      out->type_index = result.type_index;
      out->v_int = result.v_int64;
      break;
    case kTVMFFIFloat:
      out->type_index = kTVMFFIFloat;
      out->v_float = result.v_float64;
      break;
    case kTVMFFISmallStr:
    case kTVMFFISmallBytes:
      out->type_index = kTVMFFIStr;
      out->v_str = copy_bytes(result.v_bytes, result.small_str_len);
      out->str_len = result.small_str_len;
      break;
    case kTVMFFIStr:
    case kTVMFFIBytes: {
      // Str and Bytes objects hold a TVMFFIByteArray after the header.
      const TVMFFIByteArray* bytes = (const TVMFFIByteArray*)object_cell(result.v_obj);
      out->type_index = kTVMFFIStr;
      out->v_str = copy_bytes(bytes->data, bytes->size);
      out->str_len = bytes->size;
      break;
    }
    default:
      rc = dsoop_error_set(err, "TypeError", "the function returned a value of type index %d, "
                     "which dsoop does not convert", (int)result.type_index);
  }
  release_any(&result);
  return rc;
}
