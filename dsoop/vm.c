// vm.c: pools of Relax VM instances (see vm.h).
#include "vm.h"

#include "legacy_graph.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

// TVM's pooled allocator (runtime/vm.py: POOLED_ALLOCATOR), for every device.
enum { kPooledAllocator = 2 };

// One VM instance and the functions resolved on it so far, by pool index.
typedef struct {
  TVMFFIObjectHandle vm;        // or, in a graph's pool,
  DsoopGraphInstance* graph;
  DsoopFunction* fns;  // fns[i].handle is NULL until function i is first called here
  int32_t num_fns;
} Instance;

struct DsoopVMPool {
  DsoopGraph* graph;  // a relay.build model's executor, in place of a VM executable
  TVMFFIObjectHandle module;
  DsoopFunction load_executable;  // vm_load_executable: a new instance each call
  int32_t device_type, device_id, max_instances;
  pthread_mutex_t mu;
  pthread_cond_t returned;  // an instance went back, or one could not be made
  Instance** idle;          // max_instances slots
  int32_t num_idle;
  Instance** all;           // every instance made, max_instances slots
  int32_t num_all;
  int32_t num_making;       // instances being made outside the lock
  char** names;             // function names by index; only ever appended
  int32_t num_names, cap_names;
};

static void push_int(TVMFFIAny* args, int* n, int64_t v) {
  args[*n].type_index = kTVMFFIInt;
  args[*n].zero_padding = 0;
  args[*n].v_int64 = v;
  ++*n;
}

static void free_instance(Instance* inst) {
  for (int32_t i = 0; i < inst->num_fns; ++i) dsoop_object_release(inst->fns[i].handle);
  free(inst->fns);
  dsoop_object_release(inst->vm);
  dsoop_graph_instance_destroy(inst->graph);
  free(inst);
}

// A new instance, initialised as runtime/vm.py does: each device the model uses
// with its allocator, the CPU last (shape functions run there).
static int make_instance(DsoopVMPool* p, Instance** out, DsoopError* err) {
  if (p->graph != NULL) {
    Instance* inst = (Instance*)calloc(1, sizeof(Instance));
    if (inst == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for a graph instance");
    if (dsoop_graph_instance_create(p->graph, &inst->graph, err) != 0) {
      free(inst);
      return -1;
    }
    *out = inst;
    return 0;
  }
  TVMFFIAny result;
  if (dsoop_function_call_returning(&p->load_executable, NULL, 0, kDLCPU, 0, NULL, &result,
                                    err) != 0) {
    return -1;
  }
  if (result.type_index != kTVMFFIModule) {
    dsoop_any_release(&result);
    return dsoop_error_set(err, "TypeError", "vm_load_executable did not return a VM");
  }
  Instance* inst = (Instance*)calloc(1, sizeof(Instance));
  if (inst == NULL) {
    dsoop_object_release(result.v_obj);
    return dsoop_error_set(err, "MemoryError", "out of memory for a VM instance");
  }
  inst->vm = result.v_obj;
  DsoopFunction init;
  const int found = dsoop_module_get_function(inst->vm, "vm_initialization", &init, err);
  if (found != 1) {
    free_instance(inst);
    return found == 0 ? dsoop_error_set(err, "TypeError", "the VM has no vm_initialization") : -1;
  }
  TVMFFIAny args[6];
  int n = 0;
  push_int(args, &n, p->device_type);
  push_int(args, &n, p->device_id);
  push_int(args, &n, kPooledAllocator);
  if (p->device_type != kDLCPU) {
    push_int(args, &n, kDLCPU);
    push_int(args, &n, 0);
    push_int(args, &n, kPooledAllocator);
  }
  const int rc = dsoop_function_call(&init, args, n, err);
  dsoop_object_release(init.handle);
  if (rc != 0) {
    free_instance(inst);
    return -1;
  }
  *out = inst;
  return 0;
}

// Lends an idle instance, or makes one when fewer than max_instances exist, or
// waits for one to come back.
static int acquire(DsoopVMPool* p, Instance** out, DsoopError* err) {
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->num_idle > 0) {
      *out = p->idle[--p->num_idle];
      pthread_mutex_unlock(&p->mu);
      return 0;
    }
    if (p->num_all + p->num_making < p->max_instances) break;
    pthread_cond_wait(&p->returned, &p->mu);
  }
  ++p->num_making;
  pthread_mutex_unlock(&p->mu);
  // Made outside the lock: making one takes a while, and other calls go on.
  Instance* inst = NULL;
  const int rc = make_instance(p, &inst, err);
  pthread_mutex_lock(&p->mu);
  --p->num_making;
  if (rc == 0) {
    p->all[p->num_all++] = inst;
  } else {
    pthread_cond_signal(&p->returned);  // a waiter may try to make one itself
  }
  pthread_mutex_unlock(&p->mu);
  *out = inst;
  return rc;
}

static void give_back(DsoopVMPool* p, Instance* inst) {
  pthread_mutex_lock(&p->mu);
  p->idle[p->num_idle++] = inst;
  pthread_cond_signal(&p->returned);
  pthread_mutex_unlock(&p->mu);
}

int dsoop_module_is_vm(TVMFFIObjectHandle module, DsoopError* err) {
  DsoopFunction fn;
  const int found = dsoop_module_get_function(module, "vm_load_executable", &fn, err);
  if (found == 1) dsoop_object_release(fn.handle);
  return found;
}

// A pool of room for max_instances, without instances; NULL for want of memory.
static DsoopVMPool* new_pool(int32_t max_instances) {
  DsoopVMPool* p = (DsoopVMPool*)calloc(1, sizeof(DsoopVMPool));
  if (p != NULL) {
    p->idle = (Instance**)calloc((size_t)max_instances, sizeof(Instance*));
    p->all = (Instance**)calloc((size_t)max_instances, sizeof(Instance*));
  }
  if (p == NULL || p->idle == NULL || p->all == NULL) {
    if (p != NULL) {
      free(p->idle);
      free(p->all);
      free(p);
    }
    return NULL;
  }
  p->max_instances = max_instances;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->returned, NULL);
  return p;
}

// Makes the pool's first instance, so that what fails in making one fails here,
// and gives the pool to *out; destroys it on failure.
static int open_pool(DsoopVMPool* p, DsoopVMPool** out, DsoopError* err) {
  Instance* first = NULL;
  if (acquire(p, &first, err) != 0) {
    dsoop_vm_pool_destroy(p);
    return -1;
  }
  give_back(p, first);
  *out = p;
  return 0;
}

int dsoop_vm_pool_create_graph(DsoopGraph* graph, int32_t max_instances, DsoopVMPool** out,
                               DsoopError* err) {
  if (max_instances < 1) {
    dsoop_graph_destroy(graph);
    return dsoop_error_set(err, "ValueError", "a graph pool needs room for at least one instance, got %d",
                           (int)max_instances);
  }
  DsoopVMPool* p = new_pool(max_instances);
  if (p == NULL) {
    dsoop_graph_destroy(graph);
    return dsoop_error_set(err, "MemoryError", "out of memory for a graph pool");
  }
  p->graph = graph;
  p->device_type = kDLCPU;
  return open_pool(p, out, err);
}

int dsoop_vm_pool_create(TVMFFIObjectHandle module, int32_t device_type, int32_t device_id,
                         int32_t max_instances, DsoopVMPool** out, DsoopError* err) {
  if (max_instances < 1) {
    return dsoop_error_set(err, "ValueError", "a VM pool needs room for at least one instance, got %d",
                           (int)max_instances);
  }
  DsoopVMPool* p = new_pool(max_instances);
  if (p == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for a VM pool");
  const int found = dsoop_module_get_function(module, "vm_load_executable", &p->load_executable, err);
  if (found != 1) {
    dsoop_vm_pool_destroy(p);
    return found == 0 ? dsoop_error_set(err, "TypeError", "the library holds no Relax VM executable")
                      : -1;
  }
  p->module = module;
  dsoop_object_retain(module);
  p->device_type = device_type;
  p->device_id = device_id;
  return open_pool(p, out, err);
}

void dsoop_vm_pool_destroy(DsoopVMPool* p) {
  if (p == NULL) return;
  for (int32_t i = 0; i < p->num_all; ++i) free_instance(p->all[i]);
  for (int32_t i = 0; i < p->num_names; ++i) free(p->names[i]);
  free(p->names);
  free(p->idle);
  free(p->all);
  dsoop_object_release(p->load_executable.handle);
  dsoop_object_release(p->module);
  dsoop_graph_destroy(p->graph);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->returned);
  free(p);
}

int32_t dsoop_vm_pool_size(DsoopVMPool* p) {
  pthread_mutex_lock(&p->mu);
  const int32_t n = p->num_all;
  pthread_mutex_unlock(&p->mu);
  return n;
}

// The arity of VM function `name` on inst: 1 with *arity set, 0 when inst has no
// VM function of that name. The VM also answers to its own methods
// (vm_initialization, ...) and knows the model's kernels by name, but calls
// neither as a model function: a name it cannot make a closure of, or give an
// arity for, is not one. The lookup comes first: it answers "none" for unknown
// names without raising (a raised TVM error builds a backtrace, which takes
// seconds the first time in a process).
static int vm_function_arity(DsoopVMPool* p, Instance* inst, const char* name, int64_t* arity,
                             DsoopError* err) {
  if (p->graph != NULL) {  // a graph has one function, which takes the graph's inputs
    if (strcmp(name, dsoop_graph_name(p->graph)) != 0) return 0;
    *arity = dsoop_graph_num_inputs(p->graph);
    return 1;
  }
  DsoopError not_one = {NULL, NULL};
  DsoopFunction fn;
  int found = dsoop_module_get_function(inst->vm, name, &fn, &not_one);
  dsoop_error_clear(&not_one);
  if (found != 1) return 0;
  dsoop_object_release(fn.handle);
  DsoopFunction get_arity;
  found = dsoop_module_get_function(inst->vm, "get_function_arity", &get_arity, err);
  if (found != 1) {
    return found == 0 ? dsoop_error_set(err, "TypeError", "the VM has no get_function_arity") : -1;
  }
  TVMFFIAny arg;
  arg.type_index = kTVMFFIRawStr;
  arg.zero_padding = 0;
  arg.v_c_str = name;
  DsoopValue value;
  const int rc = dsoop_function_call_value(&get_arity, &arg, 1, &value, &not_one);
  dsoop_object_release(get_arity.handle);
  dsoop_error_clear(&not_one);
  if (rc != 0 || value.type_index != kTVMFFIInt || value.v_int < 0) {
    free(value.v_str);
    return 0;
  }
  *arity = value.v_int;
  return 1;
}

int dsoop_vm_pool_function(DsoopVMPool* p, const char* name, int32_t* index, int64_t* arity,
                           DsoopError* err) {
  Instance* inst = NULL;
  if (acquire(p, &inst, err) != 0) return -1;
  const int found = vm_function_arity(p, inst, name, arity, err);
  give_back(p, inst);
  if (found != 1) return found;
  pthread_mutex_lock(&p->mu);
  int rc = 1;
  int32_t i = 0;
  while (i < p->num_names && strcmp(p->names[i], name) != 0) ++i;
  if (i == p->num_names) {
    if (p->num_names == p->cap_names) {
      const int32_t cap = p->cap_names == 0 ? 4 : 2 * p->cap_names;
      char** grown = (char**)realloc(p->names, (size_t)cap * sizeof(char*));
      if (grown != NULL) {
        p->names = grown;
        p->cap_names = cap;
      }
    }
    char* copy = p->num_names < p->cap_names ? strdup(name) : NULL;
    if (copy == NULL) {
      rc = dsoop_error_set(err, "MemoryError", "out of memory for a VM function name");
    } else {
      p->names[p->num_names++] = copy;
    }
  }
  pthread_mutex_unlock(&p->mu);
  *index = i;
  return rc;
}

// Function `index` on inst, resolved there at its first call.
static int instance_function(DsoopVMPool* p, Instance* inst, int32_t index, DsoopFunction** out,
                             DsoopError* err) {
  if (index < inst->num_fns && inst->fns[index].handle != NULL) {
    *out = &inst->fns[index];
    return 0;
  }
  pthread_mutex_lock(&p->mu);
  const int32_t num_names = p->num_names;
  const char* name = index >= 0 && index < num_names ? p->names[index] : NULL;
  pthread_mutex_unlock(&p->mu);
  if (name == NULL) return dsoop_error_set(err, "IndexError", "no VM function has index %d", (int)index);
  if (inst->num_fns < num_names) {
    DsoopFunction* grown = (DsoopFunction*)realloc(inst->fns, (size_t)num_names * sizeof(DsoopFunction));
    if (grown == NULL) return dsoop_error_set(err, "MemoryError", "out of memory for VM functions");
    memset(grown + inst->num_fns, 0, (size_t)(num_names - inst->num_fns) * sizeof(DsoopFunction));
    inst->fns = grown;
    inst->num_fns = num_names;
  }
  const int found = dsoop_module_get_function(inst->vm, name, &inst->fns[index], err);
  if (found != 1) {
    inst->fns[index].handle = NULL;
    return found == 0 ? dsoop_error_set(err, "AttributeError", "the VM has no function %s", name) : -1;
  }
  *out = &inst->fns[index];
  return 0;
}

int dsoop_vm_call(DsoopVMPool* p, int32_t index, const TVMFFIAny* args, int32_t num_args,
                  void* stream, TVMFFIAny* result, DsoopError* err) {
  Instance* inst = NULL;
  if (acquire(p, &inst, err) != 0) return -1;
  if (p->graph != NULL) {
    const int rc = dsoop_graph_run(p->graph, inst->graph, args, num_args, result, err);
    give_back(p, inst);
    return rc;
  }
  DsoopFunction* fn = NULL;
  int rc = instance_function(p, inst, index, &fn, err);
  if (rc == 0) {
    rc = dsoop_function_call_returning(fn, args, num_args, p->device_type, p->device_id, stream,
                                       result, err);
  }
  give_back(p, inst);
  return rc;
}
