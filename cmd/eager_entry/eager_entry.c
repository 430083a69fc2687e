// eager_entry.c: the CPython side of eager calls without TF's op dispatch
// (tf_op/_eager.py; the C++ side is kernels/eager_call.cc). A CPython extension of the
// stable ABI (Py_LIMITED_API, 3.10): one build serves every Python from 3.10 on.
// It links no Python and no TensorFlow: it calls TF's DLPack exchange through the
// Python functions it is bound to, and the op library's TVMDSOOpEagerCall and
// TVMDSOOpEagerClose through pointers it looks up in the op library TF loaded.
//
// Why not ctypes: an eager call of a small model spent about 3 µs of its 17 in
// the Python of the entry, ctypes' argument conversion and one ctypes.pythonapi
// call per capsule; here a call is a loop in C around the op library's.
//
//   bind(op_library_path, to_dlpack, from_dlpack, context, error, lendable)
//     once per process: the op library (dlopen'ed by TF already: RTLD_NOLOAD)
//     and TF's pieces: to_dlpack(t) -> capsule, from_dlpack(capsule,
//     context_handle) -> tensor, context() -> the eager context (whose _handle
//     from_dlpack takes), error(code, message) -> the tf.errors exception, and
//     lendable, a bit mask of the TF dtype enums DLPack lends.
//   Function(handle, alignment, num_outputs)
//     owns a TVMDSOOpEagerOpen handle (closed when it goes);
//     function(inputs) -> list of tensors, or None where the op must run.
//   bind_compiled(eager_tensor_type, executing_eagerly, could_possibly_record)
//     once per process: what call_compiled asks TF.
//   call_compiled(hits, dtype_enums, args) -> outputs, or None
//     a tf_op.compile'd function's call where it has been made before: eager,
//     args eager tensors of the signature's dtypes (dtype_enums) and of shapes
//     compiled before, hits[their shapes] = (Function, pack or None), no tape
//     that could record it, no op callback. None for anything else (and where
//     the Function says the op must run): CompiledFunction.__call__ then
//     does what it always did. Its Python for the same took 1.3 µs more.
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

typedef int (*EagerCallFn)(const void* handle, DLManagedTensor** inputs, int num_in, int64_t alignment,
                           DLManagedTensor** outputs, char** message);
typedef void (*EagerCloseFn)(const void* handle);

// What bind() gave, for the process: one op library, one TF.
static EagerCallFn eager_call = NULL;
static EagerCloseFn eager_close = NULL;
static PyObject* to_dlpack = NULL;
static PyObject* from_dlpack = NULL;
static PyObject* eager_context = NULL;
static PyObject* make_error = NULL;
static uint64_t lendable = 0;
static PyObject* datatype_enum_name = NULL;  // "_datatype_enum"
static PyObject* handle_name = NULL;          // "_handle"
// What bind_compiled() gave.
static PyObject* eager_tensor_type = NULL;
static PyObject* executing_eagerly = NULL;
static PyObject* could_possibly_record = NULL;
static PyObject* shape_tuple_name = NULL;   // "_shape_tuple"
static PyObject* op_callbacks_name = NULL;  // "op_callbacks"

static const int kUseTheOp = -1;
static const char kDLTensor[] = "dltensor";
static const char kUsedDLTensor[] = "used_dltensor";
// Arrays of up to this many inputs or outputs live on the stack.
enum { kOnStack = 8 };

// *slot = value, a new reference, the old one dropped.
static void keep(PyObject** slot, PyObject* value) {
  PyObject* old = *slot;
  Py_INCREF(value);
  *slot = value;
  Py_XDECREF(old);
}

static PyObject* bind(PyObject* module, PyObject* args) {
  (void)module;
  const char* path = NULL;
  PyObject *to, *from, *context, *error;
  unsigned long long mask = 0;
  if (!PyArg_ParseTuple(args, "sOOOOK:bind", &path, &to, &from, &context, &error, &mask)) return NULL;
  // The op library TF loaded, not a second copy (which would start a second Go runtime).
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (library == NULL) {
    PyErr_Format(PyExc_ImportError, "tf_op: the op library %s is not loaded in this process", path);
    return NULL;
  }
  EagerCallFn call = (EagerCallFn)dlsym(library, "TVMDSOOpEagerCall");
  EagerCloseFn close = (EagerCloseFn)dlsym(library, "TVMDSOOpEagerClose");
  dlclose(library);  // TF's reference keeps it loaded
  if (call == NULL || close == NULL) {
    PyErr_Format(PyExc_ImportError, "tf_op: the op library %s has no TVMDSOOpEagerCall or TVMDSOOpEagerClose", path);
    return NULL;
  }
  eager_call = call;
  eager_close = close;
  keep(&to_dlpack, to);
  keep(&from_dlpack, from);
  keep(&eager_context, context);
  keep(&make_error, error);
  lendable = mask;
  Py_RETURN_NONE;
}

typedef struct {
  PyObject_HEAD
  const void* handle;  // TVMDSOOpEagerOpen's, for num_outputs outputs
  int64_t alignment;
  int num_outputs;
} Function;

// Only tf_op._eager.open_function makes one, from the handle it opened for
// num_outputs outputs: another handle, or another count, is not checked here.
static PyObject* function_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  unsigned long long handle = 0;
  long long alignment = 0;
  int num_outputs = 0;
  static char* keywords[] = {"handle", "alignment", "num_outputs", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLi:Function", keywords, &handle, &alignment, &num_outputs)) {
    return NULL;
  }
  if (eager_call == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "tf_op: the eager entry is not bound to the op library");
    return NULL;
  }
  if (handle == 0 || num_outputs < 1) {
    PyErr_SetString(PyExc_ValueError, "tf_op: an eager function needs an open handle and an output");
    return NULL;
  }
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  Function* self = (Function*)alloc(type, 0);
  if (self == NULL) return NULL;
  self->handle = (const void*)(uintptr_t)handle;
  self->alignment = alignment;
  self->num_outputs = num_outputs;
  return (PyObject*)self;
}

static void function_dealloc(PyObject* object) {
  Function* self = (Function*)object;
  if (self->handle != NULL) {
    // As ctypes called it: without the GIL (the op library's Go takes locks of its own).
    Py_BEGIN_ALLOW_THREADS
    eager_close(self->handle);
    Py_END_ALLOW_THREADS
  }
  PyTypeObject* type = Py_TYPE(object);
  freefunc free_object = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free_object(object);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

// Calls a DLPack view's deleter: its owner's memory is released.
static void give_back(DLManagedTensor* view) {
  if (view->deleter != NULL) view->deleter(view);
}

// The input's TF dtype enum; -1 with an exception set where it has none.
static long datatype_enum(PyObject* tensor) {
  PyObject* value = PyObject_CallMethodObjArgs(tensor, datatype_enum_name, NULL);
  if (value == NULL) return -1;
  const long e = PyLong_AsLong(value);
  Py_DECREF(value);
  return e;
}

// The outputs as TF tensors, without a copy; on TF's refusal the views not yet
// taken go back to their owners and NULL returns with TF's exception.
static PyObject* take_outputs(DLManagedTensor** outputs, int count) {
  PyObject* context = PyObject_CallObject(eager_context, NULL);
  PyObject* context_handle = context != NULL ? PyObject_GetAttr(context, handle_name) : NULL;
  Py_XDECREF(context);
  PyObject* taken = context_handle != NULL ? PyList_New(count) : NULL;
  int k = 0;
  for (; taken != NULL && k < count; ++k) {
    PyObject* capsule = PyCapsule_New(outputs[k], kDLTensor, NULL);
    PyObject* tensor = capsule != NULL ? PyObject_CallFunctionObjArgs(from_dlpack, capsule, context_handle, NULL) : NULL;
    // TF renames a capsule it took; one still named dltensor is still ours.
    const int still_ours = capsule == NULL || PyCapsule_IsValid(capsule, kDLTensor);
    Py_XDECREF(capsule);
    if (tensor == NULL) {
      if (still_ours) give_back(outputs[k]);
      Py_CLEAR(taken);
    } else {
      PyList_SetItem(taken, k, tensor);  // steals the reference
    }
  }
  for (; k < count; ++k) give_back(outputs[k]);  // not reached: back to their owners
  Py_XDECREF(context_handle);
  return taken;
}

static PyObject* function_call(PyObject* object, PyObject* args, PyObject* kwargs) {
  Function* self = (Function*)object;
  PyObject* given = NULL;
  if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "tf_op: an eager function takes its inputs' list only");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "O:Function", &given)) return NULL;
  // A tuple of them, held for the call: the Python the loop calls (another
  // thread's, too) could change a list and free an input it still uses.
  PyObject* inputs = PySequence_Tuple(given);
  if (inputs == NULL) return NULL;
  const Py_ssize_t count = PyTuple_Size(inputs);
  if (count > INT_MAX) {
    Py_DECREF(inputs);
    PyErr_SetString(PyExc_ValueError, "tf_op: too many inputs");
    return NULL;
  }
  PyObject* capsules_on_stack[kOnStack];
  DLManagedTensor* pointers_on_stack[kOnStack];
  DLManagedTensor* outputs_on_stack[kOnStack];
  PyObject** capsules = capsules_on_stack;
  DLManagedTensor** pointers = pointers_on_stack;
  DLManagedTensor** outputs = outputs_on_stack;
  if (count > kOnStack) {
    capsules = PyMem_Malloc(sizeof(PyObject*) * count);
    pointers = PyMem_Malloc(sizeof(DLManagedTensor*) * count);
  }
  if (self->num_outputs > kOnStack) outputs = PyMem_Malloc(sizeof(DLManagedTensor*) * self->num_outputs);
  PyObject* result = NULL;
  Py_ssize_t made = 0;  // capsules made so far
  char* message = NULL;
  int code = 0;
  if (capsules == NULL || pointers == NULL || outputs == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (; made < count; ++made) {
    PyObject* tensor = PyTuple_GetItem(inputs, made);
    const long dtype = datatype_enum(tensor);
    if (dtype == -1 && PyErr_Occurred()) goto done;
    // TF's to_dlpack aborts the process on a string tensor: the op says what it takes.
    if (dtype < 0 || dtype >= 64 || !(lendable & (UINT64_C(1) << dtype))) {
      result = Py_None;
      Py_INCREF(result);
      goto done;
    }
    PyObject* capsule = PyObject_CallFunctionObjArgs(to_dlpack, tensor, NULL);
    if (capsule == NULL) goto done;
    capsules[made] = capsule;
    pointers[made] = PyCapsule_GetPointer(capsule, kDLTensor);
    if (pointers[made] == NULL) {
      ++made;
      goto done;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  code = eager_call(self->handle, pointers, (int)count, self->alignment, outputs, &message);
  Py_END_ALLOW_THREADS
  if (code == kUseTheOp) {  // nothing taken: the capsules still own the inputs
    result = Py_None;
    Py_INCREF(result);
    goto done;
  }
  // The op library has taken each input (and deleted it, or will): the
  // capsules must not delete them again.
  for (Py_ssize_t i = 0; i < count; ++i) PyCapsule_SetName(capsules[i], kUsedDLTensor);
  if (code != 0) {
    PyObject* text = PyUnicode_DecodeUTF8(message != NULL ? message : "", message != NULL ? strlen(message) : 0,
                                          "replace");
    free(message);
    PyObject* error = text != NULL ? PyObject_CallFunction(make_error, "iO", code, text) : NULL;
    Py_XDECREF(text);
    if (error != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(error), error);
      Py_DECREF(error);
    }
    goto done;
  }
  result = take_outputs(outputs, self->num_outputs);

done:
  Py_DECREF(inputs);
  for (Py_ssize_t i = 0; i < made; ++i) Py_DECREF(capsules[i]);
  if (capsules != capsules_on_stack) PyMem_Free(capsules);
  if (pointers != pointers_on_stack) PyMem_Free(pointers);
  if (outputs != outputs_on_stack) PyMem_Free(outputs);
  return result;
}

static PyObject* bind_compiled(PyObject* module, PyObject* args) {
  (void)module;
  PyObject *type, *eagerly, *record;
  if (!PyArg_ParseTuple(args, "O!OO:bind_compiled", &PyType_Type, &type, &eagerly, &record)) return NULL;
  keep(&eager_tensor_type, type);
  keep(&executing_eagerly, eagerly);
  keep(&could_possibly_record, record);
  Py_RETURN_NONE;
}

// Whether calling `predicate` (no arguments) gives something true: 1, 0, or -1
// with an exception set.
static int asks(PyObject* predicate) {
  PyObject* answer = PyObject_CallObject(predicate, NULL);
  if (answer == NULL) return -1;
  const int yes = PyObject_IsTrue(answer);
  Py_DECREF(answer);
  return yes;
}

// Whether an op callback watches: the eager context's op_callbacks are not empty.
static int op_callbacks_watch(void) {
  PyObject* context = PyObject_CallObject(eager_context, NULL);
  PyObject* callbacks = context != NULL ? PyObject_GetAttr(context, op_callbacks_name) : NULL;
  Py_XDECREF(context);
  if (callbacks == NULL) return -1;
  const int yes = PyObject_IsTrue(callbacks);
  Py_DECREF(callbacks);
  return yes;
}

// The args as a tuple of eager tensors of the signature's dtypes and the key of
// their shapes (a tuple of their shape tuples): 1; 0 where they are not; -1 with
// an exception set.
static int eager_inputs(PyObject* dtype_enums, PyObject* args, PyObject** inputs, PyObject** key) {
  const Py_ssize_t count = PyTuple_Size(args);
  *inputs = PyTuple_New(count);
  *key = PyTuple_New(count);
  if (*inputs == NULL || *key == NULL) return -1;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* tensor = PyTuple_GetItem(args, i);
    if ((PyObject*)Py_TYPE(tensor) != eager_tensor_type) return 0;
    const long dtype = datatype_enum(tensor);
    if (dtype == -1 && PyErr_Occurred()) return -1;
    const long wanted = PyLong_AsLong(PyTuple_GetItem(dtype_enums, i));
    if (wanted == -1 && PyErr_Occurred()) return -1;
    if (dtype != wanted) return 0;
    PyObject* shape = PyObject_CallMethodObjArgs(tensor, shape_tuple_name, NULL);
    if (shape == NULL) return -1;
    PyTuple_SetItem(*key, i, shape);  // steals the reference
    Py_INCREF(tensor);
    PyTuple_SetItem(*inputs, i, tensor);  // steals the reference
  }
  return 1;
}

static PyObject* call_compiled(PyObject* module, PyObject* const* argv, Py_ssize_t argc) {
  (void)module;
  if (argc != 3 || !PyDict_Check(argv[0]) || !PyTuple_Check(argv[1]) || !PyTuple_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "tf_op: call_compiled takes a dict, a tuple of dtype enums and the args' tuple");
    return NULL;
  }
  PyObject *hits = argv[0], *dtype_enums = argv[1], *args = argv[2];
  if (eager_tensor_type == NULL || PyDict_Size(hits) == 0 || PyTuple_Size(args) != PyTuple_Size(dtype_enums)) {
    Py_RETURN_NONE;
  }
  PyObject *inputs = NULL, *key = NULL, *hit = NULL, *flat = NULL, *result = NULL;
  int yes = asks(executing_eagerly);
  if (yes != 1) goto done;
  if ((yes = eager_inputs(dtype_enums, args, &inputs, &key)) != 1) goto done;
  // Held: the Python asked below (another thread's, too) may replace it in hits.
  hit = PyDict_GetItemWithError(hits, key);
  Py_XINCREF(hit);
  PyObject *function, *pack;
  if (hit == NULL || !PyArg_ParseTuple(hit, "OO", &function, &pack)) {
    yes = PyErr_Occurred() ? -1 : 0;
    goto done;
  }
  if ((yes = asks(could_possibly_record)) != 0 || (yes = op_callbacks_watch()) != 0) {
    yes = yes == 1 ? 0 : -1;  // a tape or a callback: the Python path
    goto done;
  }
  flat = PyObject_CallFunctionObjArgs(function, inputs, NULL);
  if (flat == NULL || flat == Py_None) {
    yes = flat == NULL ? -1 : 0;
  } else if (pack == Py_None) {
    result = PyList_GetItem(flat, 0);  // one output: the tensor itself
    Py_XINCREF(result);
  } else {
    result = PyObject_CallFunctionObjArgs(pack, flat, NULL);
  }
  if (result == NULL && !PyErr_Occurred()) yes = 0;

done:
  Py_XDECREF(inputs);
  Py_XDECREF(key);
  Py_XDECREF(hit);
  Py_XDECREF(flat);
  if (result != NULL) return result;
  if (yes == -1 || PyErr_Occurred()) return NULL;
  Py_RETURN_NONE;  // not a call it takes
}

static PyType_Slot function_slots[] = {
    {Py_tp_doc, "One function of one library, opened for eager calls on the CPU (tf_op._eager)."},
    {Py_tp_new, function_new},
    {Py_tp_dealloc, function_dealloc},
    {Py_tp_call, function_call},
    {0, NULL},
};

static PyType_Spec function_spec = {
    .name = "tf_op._eager_entry.Function",
    .basicsize = sizeof(Function),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = function_slots,
};

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Binds the entry to the op library TF loaded and to TF's DLPack exchange."},
    {"bind_compiled", bind_compiled, METH_VARARGS, "Binds call_compiled to TF's questions."},
    {"call_compiled", (PyCFunction)(void (*)(void))call_compiled, METH_FASTCALL,
     "A compiled function's call of shapes it has made before, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_eager_entry",
    .m_doc = "Eager calls of the op library's functions (tf_op._eager).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__eager_entry(void) {
  datatype_enum_name = PyUnicode_InternFromString("_datatype_enum");
  handle_name = PyUnicode_InternFromString("_handle");
  shape_tuple_name = PyUnicode_InternFromString("_shape_tuple");
  op_callbacks_name = PyUnicode_InternFromString("op_callbacks");
  if (datatype_enum_name == NULL || handle_name == NULL || shape_tuple_name == NULL || op_callbacks_name == NULL) {
    return NULL;
  }
  PyObject* module = PyModule_Create(&module_def);
  if (module == NULL) return NULL;
  PyObject* type = PyType_FromSpec(&function_spec);
  const int added = type != NULL ? PyModule_AddObjectRef(module, "Function", type) : -1;
  Py_XDECREF(type);
  if (added != 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
