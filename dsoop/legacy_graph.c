// legacy_graph.c: the graph executor of relay.build's models (see legacy_graph.h).
#include "legacy_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// TVM's allocation alignment (kAllocAlignment): what its kernels were compiled
// to assume of the tensors they are handed.
enum { kGraphAlignment = 64 };

// A param of storage that is not shared (it shares its storage with tensors the
// kernels write): copied into each instance's storage when the instance is made.
typedef struct {
  int32_t entry;
  void* data;
  int64_t nbytes;
} PrivateParam;

typedef struct {
  LegacyPackedCFunc fn;  // NULL for a no-op
  char* func;            // its name, for messages
  int32_t first_arg;     // its arguments in the instance's args
  int32_t num_args;
  int flatten;
} Op;

struct DsoopGraph {
  DsoopLegacyLibrary* lib;  // one reference
  char* name;
  int32_t num_storage, num_entries, num_ops, num_inputs, num_outputs, num_args;
  int64_t* storage_bytes;
  void** shared;  // per storage: the shared params' memory, or NULL for per-instance storage
  int32_t* entry_storage;
  DLDataType* entry_dtype;
  int32_t* entry_ndim;
  int64_t** entry_shape;  // into shapes
  int64_t* shapes;
  int64_t* entry_bytes;
  int64_t* entry_elems;  // the flattened shape of each entry
  Op* ops;
  int32_t* args;  // the entries of every op's arguments, op after op
  int32_t* input_entry;
  char** input_name;
  int32_t* output_entry;
  PrivateParam* private_params;
  int32_t num_private_params;
  DsoopFunction make_array;  // ffi.Array, for several outputs
};

struct DsoopGraphInstance {
  char* block;          // the instance's storage, one block
  void** storage;       // per storage: its memory in block (NULL where shared)
  DLTensor* entries;    // every entry, over its storage
  DLTensor* flattened;  // the arguments of flatten_data ops, by argument
  LegacyValue* values;  // every op's arguments, op after op
  int* codes;
};

static void* aligned_block(int64_t nbytes) {
  const size_t size = ((size_t)(nbytes > 0 ? nbytes : 1) + kGraphAlignment - 1) / kGraphAlignment * kGraphAlignment;
  void* p = aligned_alloc(kGraphAlignment, size);
  if (p != NULL) memset(p, 0, size);  // no kernel reads memory it did not write, but no one sees garbage
  return p;
}

const char* dsoop_graph_name(const DsoopGraph* g) { return g->name; }
int32_t dsoop_graph_num_inputs(const DsoopGraph* g) { return g->num_inputs; }

void dsoop_graph_destroy(DsoopGraph* g) {
  if (g == NULL) return;
  if (g->shared != NULL) {
    for (int32_t s = 0; s < g->num_storage; ++s) free(g->shared[s]);
  }
  for (int32_t i = 0; i < g->num_private_params; ++i) free(g->private_params[i].data);
  if (g->ops != NULL) {
    for (int32_t o = 0; o < g->num_ops; ++o) free(g->ops[o].func);
  }
  if (g->input_name != NULL) {
    for (int32_t i = 0; i < g->num_inputs; ++i) free(g->input_name[i]);
  }
  free(g->private_params);
  free(g->input_name);
  free(g->input_entry);
  free(g->output_entry);
  free(g->args);
  free(g->ops);
  free(g->entry_elems);
  free(g->entry_bytes);
  free(g->shapes);
  free(g->entry_shape);
  free(g->entry_ndim);
  free(g->entry_dtype);
  free(g->entry_storage);
  free(g->shared);
  free(g->storage_bytes);
  free(g->name);
  if (g->make_array.handle != NULL) dsoop_object_release(g->make_array.handle);
  if (g->lib != NULL) dsoop_legacy_release(g->lib);
  free(g);
}

// calloc of n items that fails only for want of memory (n 0 gives a block).
static void* alloc_items(int64_t n, size_t size) { return calloc((size_t)(n > 0 ? n : 1), size); }

// The checks the plan already passed in Go, repeated where a wrong index would
// write out of bounds here: cheap, once per model.
static int check_spec(const DsoopGraphSpec* s, int64_t* num_args, int64_t* num_dims, DsoopError* err) {
  if (s->num_storage < 0 || s->num_entries < 0 || s->num_ops < 0 || s->num_inputs < 0 ||
      s->num_outputs < 1) {
    return dsoop_error_set(err, "ValueError", "a graph plan with a negative count, or no outputs");
  }
  *num_dims = 0;
  for (int32_t e = 0; e < s->num_entries; ++e) {
    if (s->entry_storage[e] < 0 || s->entry_storage[e] >= s->num_storage || s->entry_ndim[e] < 0 ||
        s->entry_ndim[e] > 64) {
      return dsoop_error_set(err, "ValueError", "graph entry %d: bad storage or rank", (int)e);
    }
    *num_dims += s->entry_ndim[e];
  }
  *num_args = 0;
  for (int32_t o = 0; o < s->num_ops; ++o) {
    if (s->op_num_args[o] < 0) return dsoop_error_set(err, "ValueError", "graph op %d: bad arity", (int)o);
    for (int32_t a = 0; a < s->op_num_args[o]; ++a) {
      const int32_t e = s->op_args[*num_args + a];
      if (e < 0 || e >= s->num_entries) {
        return dsoop_error_set(err, "ValueError", "graph op %d: bad entry %d", (int)o, (int)e);
      }
    }
    *num_args += s->op_num_args[o];
    if (*num_args > INT32_MAX) return dsoop_error_set(err, "ValueError", "a graph of too many arguments");
  }
  for (int32_t i = 0; i < s->num_inputs; ++i) {
    if (s->input_entry[i] < 0 || s->input_entry[i] >= s->num_entries) {
      return dsoop_error_set(err, "ValueError", "graph input %d: bad entry", (int)i);
    }
  }
  for (int32_t i = 0; i < s->num_outputs; ++i) {
    if (s->output_entry[i] < 0 || s->output_entry[i] >= s->num_entries) {
      return dsoop_error_set(err, "ValueError", "graph output %d: bad entry", (int)i);
    }
  }
  return 0;
}

int dsoop_graph_create(DsoopLegacyLibrary* lib, const char* name, const DsoopGraphSpec* s,
                       DsoopGraph** out, DsoopError* err) {
  int64_t num_args = 0, num_dims = 0;
  if (check_spec(s, &num_args, &num_dims, err) != 0) return -1;
  DsoopGraph* g = (DsoopGraph*)calloc(1, sizeof(DsoopGraph));
  if (g == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for a graph");
  g->num_storage = s->num_storage;
  g->num_entries = s->num_entries;
  g->num_ops = s->num_ops;
  g->num_inputs = s->num_inputs;
  g->num_outputs = s->num_outputs;
  g->num_args = (int32_t)num_args;
  g->name = strdup(name);
  g->storage_bytes = (int64_t*)alloc_items(s->num_storage, sizeof(int64_t));
  g->shared = (void**)alloc_items(s->num_storage, sizeof(void*));
  g->entry_storage = (int32_t*)alloc_items(s->num_entries, sizeof(int32_t));
  g->entry_dtype = (DLDataType*)alloc_items(s->num_entries, sizeof(DLDataType));
  g->entry_ndim = (int32_t*)alloc_items(s->num_entries, sizeof(int32_t));
  g->entry_shape = (int64_t**)alloc_items(s->num_entries, sizeof(int64_t*));
  g->shapes = (int64_t*)alloc_items(num_dims, sizeof(int64_t));
  g->entry_bytes = (int64_t*)alloc_items(s->num_entries, sizeof(int64_t));
  g->entry_elems = (int64_t*)alloc_items(s->num_entries, sizeof(int64_t));
  g->ops = (Op*)alloc_items(s->num_ops, sizeof(Op));
  g->args = (int32_t*)alloc_items(num_args, sizeof(int32_t));
  g->input_entry = (int32_t*)alloc_items(s->num_inputs, sizeof(int32_t));
  g->input_name = (char**)alloc_items(s->num_inputs, sizeof(char*));
  g->output_entry = (int32_t*)alloc_items(s->num_outputs, sizeof(int32_t));
  g->private_params = (PrivateParam*)alloc_items(s->num_entries, sizeof(PrivateParam));
  if (g->name == NULL || g->storage_bytes == NULL || g->shared == NULL || g->entry_storage == NULL ||
      g->entry_dtype == NULL || g->entry_ndim == NULL || g->entry_shape == NULL || g->shapes == NULL ||
      g->entry_bytes == NULL || g->entry_elems == NULL || g->ops == NULL || g->args == NULL ||
      g->input_entry == NULL || g->input_name == NULL || g->output_entry == NULL ||
      g->private_params == NULL) {
    dsoop_graph_destroy(g);
    return dsoop_error_set(err, "MemoryError", "out of memory for a graph");
  }
  g->lib = lib;
  dsoop_legacy_retain(lib);
  memcpy(g->storage_bytes, s->storage_bytes, (size_t)s->num_storage * sizeof(int64_t));
  for (int32_t st = 0; st < s->num_storage; ++st) {
    if (s->storage_shared[st] && (g->shared[st] = aligned_block(s->storage_bytes[st])) == NULL) {
      dsoop_graph_destroy(g);
      return dsoop_error_set(err, "MemoryError", "out of memory for a graph's params");
    }
  }
  int64_t dim = 0;
  for (int32_t e = 0; e < s->num_entries; ++e) {
    g->entry_storage[e] = s->entry_storage[e];
    g->entry_dtype[e] = s->entry_dtype[e];
    g->entry_ndim[e] = s->entry_ndim[e];
    g->entry_shape[e] = g->shapes + dim;
    int64_t elems = 1;
    for (int32_t d = 0; d < s->entry_ndim[e]; ++d, ++dim) {
      g->shapes[dim] = s->entry_shape[dim];
      elems *= s->entry_shape[dim];  // Go bounded every entry's bytes
    }
    g->entry_elems[e] = elems;
    g->entry_bytes[e] = elems * (((int64_t)s->entry_dtype[e].bits * s->entry_dtype[e].lanes + 7) / 8);
  }
  memcpy(g->args, s->op_args, (size_t)num_args * sizeof(int32_t));
  int32_t arg = 0;
  for (int32_t o = 0; o < s->num_ops; ++o) {
    Op* op = &g->ops[o];
    op->first_arg = arg;
    op->num_args = s->op_num_args[o];
    op->flatten = s->op_flatten[o];
    arg += op->num_args;
    if (s->op_func[o][0] == '\0') continue;  // a no-op
    if ((op->func = strdup(s->op_func[o])) == NULL) {
      dsoop_graph_destroy(g);
      return dsoop_error_set(err, "MemoryError", "out of memory for a graph");
    }
    *(void**)(&op->fn) = dsoop_legacy_symbol(lib, s->op_func[o]);
    if (op->fn == NULL) {
      dsoop_graph_destroy(g);
      return dsoop_error_set(err, "ValueError", "the graph calls %s, which the library does not define",
                             s->op_func[o]);
    }
  }
  for (int32_t i = 0; i < s->num_inputs; ++i) {
    g->input_entry[i] = s->input_entry[i];
    if ((g->input_name[i] = strdup(s->input_name[i])) == NULL) {
      dsoop_graph_destroy(g);
      return dsoop_error_set(err, "MemoryError", "out of memory for a graph");
    }
  }
  memcpy(g->output_entry, s->output_entry, (size_t)s->num_outputs * sizeof(int32_t));
  if (s->num_outputs > 1) {
    const int found = dsoop_global_function("ffi.Array", &g->make_array, err);
    if (found != 1) {
      dsoop_graph_destroy(g);
      return found == 0 ? dsoop_error_set(err, "RuntimeError", "the TVM-FFI runtime has no ffi.Array") : -1;
    }
  }
  *out = g;
  return 0;
}

int dsoop_graph_set_param(DsoopGraph* g, int32_t entry, const void* data, int64_t nbytes,
                          DsoopError* err) {
  if (entry < 0 || entry >= g->num_entries || nbytes != g->entry_bytes[entry]) {
    return dsoop_error_set(err, "ValueError", "a param of %lld bytes for graph entry %d",
                           (long long)nbytes, (int)entry);
  }
  void* shared = g->shared[g->entry_storage[entry]];
  if (shared != NULL) {
    if (nbytes > 0) memcpy(shared, data, (size_t)nbytes);
    return 0;
  }
  PrivateParam* p = &g->private_params[g->num_private_params];
  if (g->num_private_params == g->num_entries) {
    return dsoop_error_set(err, "ValueError", "more params than graph entries");
  }
  if ((p->data = malloc((size_t)(nbytes > 0 ? nbytes : 1))) == NULL) {
    return dsoop_error_set(err, "MemoryError", "out of memory for a graph's params");
  }
  if (nbytes > 0) memcpy(p->data, data, (size_t)nbytes);
  p->entry = entry;
  p->nbytes = nbytes;
  ++g->num_private_params;
  return 0;
}

void dsoop_graph_instance_destroy(DsoopGraphInstance* inst) {
  if (inst == NULL) return;
  free(inst->codes);
  free(inst->values);
  free(inst->flattened);
  free(inst->entries);
  free(inst->storage);
  free(inst->block);
  free(inst);
}

int dsoop_graph_instance_create(DsoopGraph* g, DsoopGraphInstance** out, DsoopError* err) {
  DsoopGraphInstance* inst = (DsoopGraphInstance*)calloc(1, sizeof(DsoopGraphInstance));
  if (inst == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for a graph instance");
  inst->storage = (void**)alloc_items(g->num_storage, sizeof(void*));
  inst->entries = (DLTensor*)alloc_items(g->num_entries, sizeof(DLTensor));
  inst->flattened = (DLTensor*)alloc_items(g->num_args, sizeof(DLTensor));
  inst->values = (LegacyValue*)alloc_items(g->num_args, sizeof(LegacyValue));
  inst->codes = (int*)alloc_items(g->num_args, sizeof(int));
  // The instance's storage is one block, each storage at TVM's alignment in it.
  int64_t total = 0;
  for (int32_t s = 0; s < g->num_storage; ++s) {
    if (g->shared[s] == NULL) total += (g->storage_bytes[s] + kGraphAlignment - 1) / kGraphAlignment * kGraphAlignment;
  }
  inst->block = (char*)aligned_block(total);
  if (inst->storage == NULL || inst->entries == NULL || inst->flattened == NULL ||
      inst->values == NULL || inst->codes == NULL || inst->block == NULL) {
    dsoop_graph_instance_destroy(inst);
    return dsoop_error_set(err, "MemoryError", "out of memory for a graph instance (%lld bytes of tensors)",
                           (long long)total);
  }
  int64_t at = 0;
  for (int32_t s = 0; s < g->num_storage; ++s) {
    if (g->shared[s] != NULL) continue;
    inst->storage[s] = inst->block + at;
    at += (g->storage_bytes[s] + kGraphAlignment - 1) / kGraphAlignment * kGraphAlignment;
  }
  for (int32_t e = 0; e < g->num_entries; ++e) {
    const int32_t s = g->entry_storage[e];
    DLTensor* t = &inst->entries[e];
    t->data = g->shared[s] != NULL ? g->shared[s] : inst->storage[s];
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    t->ndim = g->entry_ndim[e];
    t->dtype = g->entry_dtype[e];
    t->shape = g->entry_shape[e];
    t->strides = NULL;
    t->byte_offset = 0;
  }
  for (int32_t i = 0; i < g->num_private_params; ++i) {
    const PrivateParam* p = &g->private_params[i];
    if (p->nbytes > 0) memcpy(inst->entries[p->entry].data, p->data, (size_t)p->nbytes);
  }
  for (int32_t o = 0; o < g->num_ops; ++o) {
    const Op* op = &g->ops[o];
    for (int32_t a = op->first_arg; a < op->first_arg + op->num_args; ++a) {
      DLTensor* t = &inst->entries[g->args[a]];
      if (op->flatten) {
        // TVM's CreateTVMOp: the same memory as one dimension.
        inst->flattened[a] = *t;
        inst->flattened[a].ndim = 1;
        inst->flattened[a].shape = &g->entry_elems[g->args[a]];
        t = &inst->flattened[a];
      }
      inst->values[a].v_handle = t;
      inst->codes[a] = kLegacyDLTensorHandle;
    }
  }
  *out = inst;
  return 0;
}

// --- a run ---------------------------------------------------------------------------

// Old TVM's bool (uint1, one byte a value) is DLPack's bool of 8 bits outside.
static int is_legacy_bool(DLDataType t) { return t.code == kDLUInt && t.bits == 1 && t.lanes == 1; }

static int same_dtype(DLDataType entry, DLDataType given) {
  if (is_legacy_bool(entry)) return (given.code == kDLBool && given.bits == 8 && given.lanes == 1) || is_legacy_bool(given);
  return entry.code == given.code && entry.bits == given.bits && entry.lanes == given.lanes;
}

static void format_dtype(DLDataType t, char* buf, size_t size) {
  static const char* const kCodes[] = {"int", "uint", "float", "handle", "bfloat"};
  if (is_legacy_bool(t) || (t.code == kDLBool && t.bits == 8)) {
    snprintf(buf, size, "bool");
  } else if (t.code < sizeof(kCodes) / sizeof(kCodes[0])) {
    snprintf(buf, size, t.lanes == 1 ? "%s%d" : "%s%dx%d", kCodes[t.code], (int)t.bits, (int)t.lanes);
  } else {
    snprintf(buf, size, "type code %d, %d bits x%d", (int)t.code, (int)t.bits, (int)t.lanes);
  }
}

static void format_shape(const int64_t* shape, int32_t ndim, char* buf, size_t size) {
  size_t at = (size_t)snprintf(buf, size, "[");
  for (int32_t d = 0; d < ndim && at < size; ++d) {
    at += (size_t)snprintf(buf + at, size - at, d == 0 ? "%lld" : ", %lld", (long long)shape[d]);
  }
  if (at < size) snprintf(buf + at, size - at, "]");
}

// A row-major tensor with no gaps (TF's tensors are): the only layout copied in whole.
static int compact(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

// Copies input i into its entry, after checking that it is one.
static int set_input(DsoopGraph* g, DsoopGraphInstance* inst, int32_t i, const TVMFFIAny* arg,
                     DsoopError* err) {
  const DLTensor* t = NULL;
  if (arg->type_index == kTVMFFITensor) {
    t = (const DLTensor*)((const char*)arg->v_obj + sizeof(TVMFFIObject));
  } else if (arg->type_index == kTVMFFIDLTensorPtr) {
    t = (const DLTensor*)arg->v_ptr;
  }
  const DLTensor* entry = &inst->entries[g->input_entry[i]];
  const char* name = g->input_name[i];
  if (t == NULL) {
    return dsoop_error_set(err, "TypeError", "%s: input '%s' is not a tensor (TVM-FFI type index %d)",
                           g->name, name, (int)arg->type_index);
  }
  if (t->device.device_type != kDLCPU) {
    return dsoop_error_set(err, "ValueError", "%s: input '%s' is on device type %d: the model runs on the CPU",
                           g->name, name, (int)t->device.device_type);
  }
  char want[512], got[512];
  if (!same_dtype(entry->dtype, t->dtype)) {
    format_dtype(entry->dtype, want, sizeof(want));
    format_dtype(t->dtype, got, sizeof(got));
    return dsoop_error_set(err, "ValueError", "%s: input '%s' must be %s, got %s", g->name, name, want, got);
  }
  int same = t->ndim == entry->ndim;
  for (int32_t d = 0; same && d < t->ndim; ++d) same = t->shape[d] == entry->shape[d];
  if (!same) {
    format_shape(entry->shape, entry->ndim, want, sizeof(want));
    format_shape(t->shape, t->ndim, got, sizeof(got));
    return dsoop_error_set(err, "ValueError", "%s: input '%s' must have shape %s, got %s", g->name, name, want, got);
  }
  if (!compact(t)) {
    return dsoop_error_set(err, "ValueError", "%s: input '%s' is strided: the model takes compact tensors",
                           g->name, name);
  }
  const int64_t nbytes = g->entry_bytes[g->input_entry[i]];
  if (nbytes > 0) {
    if (t->data == NULL) return dsoop_error_set(err, "ValueError", "%s: input '%s' has no data", g->name, name);
    memcpy(entry->data, (const char*)t->data + t->byte_offset, (size_t)nbytes);
  }
  return 0;
}

// The memory behind a returned tensor, with its shape, freed by its deleter.
typedef struct {
  DLManagedTensor managed;
  int64_t shape[];
} OwnedTensor;

static void owned_tensor_delete(DLManagedTensor* m) {
  free(m->dl_tensor.data);
  free(m);
}

// A new Tensor object holding a copy of entry e.
static int copy_output(DsoopGraph* g, DsoopGraphInstance* inst, int32_t e, TVMFFIObjectHandle* out,
                       DsoopError* err) {
  const DLTensor* from = &inst->entries[e];
  OwnedTensor* t = (OwnedTensor*)calloc(1, sizeof(OwnedTensor) + (size_t)from->ndim * sizeof(int64_t));
  void* data = aligned_block(g->entry_bytes[e]);
  if (t == NULL || data == NULL) {
    free(t);
    free(data);
    return dsoop_error_set(err, "MemoryError", "out of memory for an output of %s", g->name);
  }
  if (g->entry_bytes[e] > 0) memcpy(data, from->data, (size_t)g->entry_bytes[e]);
  memcpy(t->shape, from->shape, (size_t)from->ndim * sizeof(int64_t));
  t->managed.dl_tensor = *from;
  t->managed.dl_tensor.data = data;
  t->managed.dl_tensor.shape = t->shape;
  if (is_legacy_bool(from->dtype)) {
    t->managed.dl_tensor.dtype.code = kDLBool;
    t->managed.dl_tensor.dtype.bits = 8;
  }
  t->managed.deleter = owned_tensor_delete;
  if (dsoop_tensor_from_dlpack(&t->managed, out, err) != 0) {
    owned_tensor_delete(&t->managed);
    return -1;
  }
  return 0;
}

// The outputs as what the model returns: one Tensor, or an Array of them.
static int outputs(DsoopGraph* g, DsoopGraphInstance* inst, TVMFFIAny* result, DsoopError* err) {
  enum { kStackOutputs = 16 };
  TVMFFIAny stack[kStackOutputs];
  TVMFFIAny* tensors = g->num_outputs <= kStackOutputs ? stack : (TVMFFIAny*)calloc((size_t)g->num_outputs, sizeof(TVMFFIAny));
  if (tensors == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for the outputs of %s", g->name);
  int rc = 0;
  int32_t made = 0;
  for (; made < g->num_outputs && rc == 0; ++made) {
    tensors[made].type_index = kTVMFFITensor;
    tensors[made].zero_padding = 0;
    TVMFFIObjectHandle handle = NULL;
    rc = copy_output(g, inst, g->output_entry[made], &handle, err);
    tensors[made].v_obj = (TVMFFIObject*)handle;
  }
  if (rc != 0) --made;  // the failed one made nothing
  if (rc == 0 && g->num_outputs == 1) {
    *result = tensors[0];  // the reference passes to the caller
    made = 0;
  } else if (rc == 0) {
    rc = dsoop_call(&g->make_array, tensors, g->num_outputs, result, err);  // the Array takes its own references
  }
  for (int32_t i = 0; i < made; ++i) dsoop_object_release((TVMFFIObjectHandle)tensors[i].v_obj);
  if (tensors != stack) free(tensors);
  return rc;
}

int dsoop_graph_run(DsoopGraph* g, DsoopGraphInstance* inst, const TVMFFIAny* args,
                    int32_t num_args, TVMFFIAny* result, DsoopError* err) {
  result->type_index = kTVMFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  if (num_args != g->num_inputs) {
    return dsoop_error_set(err, "ValueError", "%s takes %d inputs, got %d", g->name, (int)g->num_inputs,
                           (int)num_args);
  }
  for (int32_t i = 0; i < num_args; ++i) {
    if (set_input(g, inst, i, &args[i], err) != 0) return -1;
  }
  for (int32_t o = 0; o < g->num_ops; ++o) {
    const Op* op = &g->ops[o];
    if (op->fn == NULL) continue;
    LegacyValue ret = {0};
    int ret_code = kLegacyNull;
    // As TVM's graph executor calls them: no resource handle.
    if (op->fn(inst->values + op->first_arg, inst->codes + op->first_arg, op->num_args, &ret, &ret_code,
               NULL) != 0) {
      DsoopError raised = {NULL, NULL};
      dsoop_error_take_raised(&raised);
      dsoop_error_set(err, raised.kind != NULL ? raised.kind : "RuntimeError", "%s: kernel %s failed: %s",
                      g->name, op->func, raised.message != NULL ? raised.message : "");
      dsoop_error_clear(&raised);
      return -1;
    }
  }
  return outputs(g, inst, result, err);
}
