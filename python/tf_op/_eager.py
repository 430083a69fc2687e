"""Eager calls of a function that returns its outputs, without TF's op dispatch.

TF's eager execution of one op (the TVMDSOOp of ``Func.run``) costs 25-45 µs on
a 2-core Zen 4: attribute hashing, the eager kernel cache, the executor. For a
small compiled model that is a third of its call (the peers benchmark's LSTM
classifier at batch 1: 92 µs an eager op call, 59 through this entry, in one
process, turn about). So an eager call that nothing else watches lends the
inputs to the op library's ``TVMDSOOpEagerCall`` (kernels/eager_call.cc) as
DLPack tensors and takes the outputs back the same way, without a copy: the
same function, resolved by the op library as a kernel's is (the library's
digest checked, its VMs shared with the op's kernels), called from C++, which
checks what it returns against the declared outputs as the op does.

``Func.run`` calls it only where the op would run the same way: eagerly, with
no tape that could record the call (a gradient needs the op), no op callback
(``tf.debugging.enable_check_numerics`` and the debugger see every op), no GPU
TF could place the op on, inputs on the CPU at the function's alignment (else
the op, which copies them). Anything else, and the op runs.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence

import tensorflow as tf
from tensorflow.python import pywrap_tfe  # what tf.experimental.dlpack calls, without its Python frames
from tensorflow.python.eager import context

from tf_op import _library

_USE_THE_OP = -1

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename.restype = ctypes.c_int
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object
_capsule_unused = ctypes.pythonapi.PyCapsule_IsValid
_capsule_unused.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_unused.restype = ctypes.c_int

#: DLPack's DLManagedTensor, as far as a deleter: DLTensor (data, device,
#: ndim, dtype, shape, strides, byte_offset), manager_ctx, deleter.
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


#: An output as the op declares it: its dtype (None: the first input's) and
#: shape (None: any; a dimension None: any).
Declared = tuple[tf.DType | None, tuple[int | None, ...] | None]

#: TF's status codes, as the op library returns them, and their error classes.
_ERRORS: dict[int, type[tf.errors.OpError]] = {
    tf.errors.CANCELLED: tf.errors.CancelledError, tf.errors.UNKNOWN: tf.errors.UnknownError,
    tf.errors.INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
    tf.errors.DEADLINE_EXCEEDED: tf.errors.DeadlineExceededError, tf.errors.NOT_FOUND: tf.errors.NotFoundError,
    tf.errors.ALREADY_EXISTS: tf.errors.AlreadyExistsError,
    tf.errors.PERMISSION_DENIED: tf.errors.PermissionDeniedError,
    tf.errors.RESOURCE_EXHAUSTED: tf.errors.ResourceExhaustedError,
    tf.errors.FAILED_PRECONDITION: tf.errors.FailedPreconditionError, tf.errors.ABORTED: tf.errors.AbortedError,
    tf.errors.OUT_OF_RANGE: tf.errors.OutOfRangeError, tf.errors.UNIMPLEMENTED: tf.errors.UnimplementedError,
    tf.errors.INTERNAL: tf.errors.InternalError, tf.errors.UNAVAILABLE: tf.errors.UnavailableError,
    tf.errors.DATA_LOSS: tf.errors.DataLossError, tf.errors.UNAUTHENTICATED: tf.errors.UnauthenticatedError,
}


#: TF's DLPack exchange: the functions tf.experimental.dlpack's wrappers call,
#: called directly (the wrappers' frames and context look-ups were a tenth of
#: the Python in an eager call).
_to_dlpack = pywrap_tfe.TFE_ToDlpackCapsule
_from_dlpack_capsule = pywrap_tfe.TFE_FromDlpackCapsule

#: The dtypes TF lends through DLPack (tf.experimental.dlpack's own list), as
#: the enums an eager tensor gives at C speed (a tf.DType hashes in Python: a
#: set of them took 0.5 µs a look-up).
_LENDABLE = frozenset(d.as_datatype_enum for d in (
    tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64,
    tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.complex64, tf.complex128))


def error(code: int, message: str) -> tf.errors.OpError:
    """The tf.errors exception the op raises for a status ``code``."""
    return _ERRORS.get(code, tf.errors.UnknownError)(None, None, message)


@functools.lru_cache(maxsize=None)
def _entry() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, ctypes._CFuncPtr]:
    handle = ctypes.POINTER(ctypes.c_void_p)
    message = ctypes.POINTER(ctypes.c_void_p)
    ints = ctypes.POINTER(ctypes.c_int)
    open_ = _library.c_function("TVMDSOOpEagerOpen", (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                                      ctypes.c_int, ints, ints, ctypes.POINTER(ctypes.c_int64),
                                                      handle, message), ctypes.c_int)
    close = _library.c_function("TVMDSOOpEagerClose", (ctypes.c_void_p,), None)
    call = _library.c_function("TVMDSOOpEagerCall", (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                                     ctypes.c_int64, ctypes.c_void_p, message), ctypes.c_int)
    return open_, close, call


@functools.lru_cache(maxsize=None)
def tf_may_place_on_a_gpu() -> bool:
    """Whether TF has a GPU to place an eager op on (it would, before the CPU)."""
    return bool(tf.config.list_logical_devices("GPU"))


class EagerCall:
    """One function of one library, resolved for eager calls on the CPU."""

    def __init__(self, lib_path: str, func_name: str, sha256: str, declared: Sequence[Declared],
                 alignment: int) -> None:
        """``declared``: per output, its dtype and shape as the op declares them."""
        open_, self._close, self._call = _entry()
        num_outputs = len(declared)
        dtypes = (ctypes.c_int * num_outputs)(*(0 if d is None else d.as_datatype_enum for d, _ in declared))
        ranks = (ctypes.c_int * num_outputs)(*(-1 if s is None else len(s) for _, s in declared))
        flat = [-1 if n is None else n for _, s in declared for n in s or ()]
        dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        handle, message = ctypes.c_void_p(), ctypes.c_void_p()
        code = open_(lib_path.encode(), func_name.encode(), sha256.encode(), num_outputs, dtypes, ranks, dims,
                     ctypes.byref(handle), ctypes.byref(message))
        if code != 0:
            raise error(code, _library.take_string(message.value))
        self._handle = handle.value
        self._alignment = alignment
        self._outputs_type = ctypes.c_void_p * num_outputs
        #: Each thread's argument arrays, made once rather than on every call
        #: (ctypes objects cost a few hundred ns each to make); per thread, as
        #: threads may call one function at once.
        self._buffers = threading.local()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            self._handle = None
            self._close(handle)

    def __call__(self, inputs: Sequence[tf.Tensor]) -> list[tf.Tensor] | None:
        """The function's outputs for ``inputs``, or None where the op must run
        it (an input DLPack cannot lend, on another device, or not at the
        function's alignment)."""
        count = len(inputs)
        buffers = self._buffers
        pointers = getattr(buffers, "inputs", None)
        if pointers is None or len(pointers) != count:
            pointers = buffers.inputs = (ctypes.c_void_p * count)()
            buffers.outputs, buffers.message = self._outputs_type(), ctypes.c_void_p()
        outputs, message = buffers.outputs, buffers.message
        capsules = []
        for i, t in enumerate(inputs):
            if t._datatype_enum() not in _LENDABLE:
                return None  # TF's to_dlpack aborts the process on a string tensor: the op says what it takes
            capsule = _to_dlpack(t)
            capsules.append(capsule)
            pointers[i] = _capsule_pointer(capsule, b"dltensor")
        message.value = None
        # ctypes passes the message by reference itself (the parameter is a pointer to its type).
        code = self._call(self._handle, pointers, count, self._alignment, outputs, message)
        if code == _USE_THE_OP:
            return None
        for c in capsules:  # the op library has taken each (and deleted it, or will)
            _capsule_rename(c, b"used_dltensor")
        if code != 0:
            raise error(code, _library.take_string(message.value))
        taken: list[tf.Tensor] = []
        handle = context.context()._handle  # the eager context: initialized, as the inputs are its tensors
        try:
            for pointer in outputs:
                taken.append(_take(pointer, handle))
        except BaseException:
            for pointer in outputs[len(taken) + 1:]:  # TF refused one: the views after it go back
                _give_back(pointer)
            raise
        return taken


def _take(pointer: int, context_handle: object) -> tf.Tensor:
    """A TF tensor of a DLPack view the op library handed over, without a copy;
    the view given back where TF refuses it (and has not taken it)."""
    capsule = _capsule_new(pointer, b"dltensor", None)
    try:
        return _from_dlpack_capsule(capsule, context_handle)
    except BaseException:
        if _capsule_unused(capsule, b"dltensor"):
            _give_back(pointer)
        raise


def _give_back(pointer: int) -> None:
    """Calls a DLPack view's deleter: its owner's memory is released."""
    managed = _Managed.from_address(pointer)
    if managed.deleter:
        managed.deleter(pointer)
