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
checks what it returns against the declared outputs as the op does. The call
itself is a CPython extension's (``_eager_entry.abi3.so``, cmd/eager_entry/eager_entry.c,
built beside the op library): through ctypes and Python it cost 3 µs more. So
is a compiled function's repeated call of a shape (``call_compiled``).

``Func.run`` calls it only where the op would run the same way: eagerly, with
no tape that could record the call (a gradient needs the op), no op callback
(``tf.debugging.enable_check_numerics`` and the debugger see every op), no GPU
TF could place the op on, inputs on the CPU at the function's alignment (else
the op, which copies them). Anything else, and the op runs.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import logging
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import tensorflow as tf
from tensorflow.python import pywrap_tfe  # what tf.experimental.dlpack calls, without its Python frames
from tensorflow.python.eager import context, record
from tensorflow.python.framework.ops import EagerTensor

from tf_op import _library

logger = logging.getLogger(__package__)

#: The extension's file name, beside the op library (CMakeLists.txt).
ENTRY_NAME = "_eager_entry.abi3.so"

#: A function opened for eager calls: its inputs in, its outputs out, or None
#: where the op must run it.
EagerFunction = Callable[[list[tf.Tensor]], "list[tf.Tensor] | None"]

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

#: The dtypes TF lends through DLPack (tf.experimental.dlpack's own list), as
#: a mask of the enums an eager tensor gives (``_datatype_enum()``).
_LENDABLE = sum(1 << d.as_datatype_enum for d in (
    tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64,
    tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.complex64, tf.complex128))


def error(code: int, message: str) -> tf.errors.OpError:
    """The tf.errors exception the op raises for a status ``code``."""
    return _ERRORS.get(code, tf.errors.UnknownError)(None, None, message)


def _load_entry(path: str) -> ModuleType | None:
    """The extension beside the op library at ``path``, bound to it and to TF's
    DLPack exchange (the functions tf.experimental.dlpack's wrappers call); None
    where the op library was built without it (a Python without C headers)."""
    entry_path = os.path.join(os.path.dirname(path), ENTRY_NAME)
    spec = importlib.util.spec_from_file_location(
        "tf_op._eager_entry", entry_path, loader=importlib.machinery.ExtensionFileLoader("tf_op._eager_entry", entry_path))
    try:
        entry = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(entry)
    except ImportError as err:
        logger.warning("tf_op: no eager entry beside the op library (%s), so eager calls run as TF ops "
                       "(25-45 µs more each): %s", path, err)
        return None
    entry.bind(path, pywrap_tfe.TFE_ToDlpackCapsule, pywrap_tfe.TFE_FromDlpackCapsule, context.context, error,
               _LENDABLE)
    entry.bind_compiled(EagerTensor, context.executing_eagerly, record.could_possibly_record)
    global call_compiled
    call_compiled = entry.call_compiled
    return entry


@functools.lru_cache(maxsize=None)
def _entry() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, ModuleType | None]:
    """TVMDSOOpEagerOpen and TVMDSOOpEagerClose, through ctypes (once a
    function), and the extension that calls (and closes) what they open."""
    handle = ctypes.POINTER(ctypes.c_void_p)
    message = ctypes.POINTER(ctypes.c_void_p)
    ints = ctypes.POINTER(ctypes.c_int)
    open_ = _library.c_function("TVMDSOOpEagerOpen", (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                                      ctypes.c_int, ints, ints, ctypes.POINTER(ctypes.c_int64),
                                                      handle, message), ctypes.c_int)
    close = _library.c_function("TVMDSOOpEagerClose", (ctypes.c_void_p,), None)
    return open_, close, _load_entry(str(_library.library_path()))


def call_compiled(hits: dict[Any, tuple[EagerFunction, Callable[[list[tf.Tensor]], Any] | None]],
                  dtype_enums: tuple[int, ...], args: tuple[Any, ...]) -> Any:
    """A compiled function's outputs for ``args``, where it called their shapes
    eagerly before through the entry, or None: for ``CompiledFunction.__call__``.
    ``hits``: by the inputs' shapes, the opened function and how to pack its
    outputs (None: the one output as it is). The extension's, once it is
    loaded (cmd/eager_entry/eager_entry.c says when it takes a call); ``hits``
    is empty until then."""
    return None


def available() -> bool:
    """Whether this op library has its eager entry."""
    return _entry()[2] is not None


@functools.lru_cache(maxsize=None)
def tf_may_place_on_a_gpu() -> bool:
    """Whether TF has a GPU to place an eager op on (it would, before the CPU)."""
    return bool(tf.config.list_logical_devices("GPU"))


def open_function(lib_path: str, func_name: str, sha256: str, declared: Sequence[Declared],
                  alignment: int) -> EagerFunction:
    """One function of one library, opened for eager calls on the CPU: the
    extension's Function, which takes a list of input tensors and returns the
    outputs, or None where the op must run it (an input DLPack cannot lend,
    on another device, or not at the function's alignment). ``declared``: per
    output, its dtype and shape as the op declares them. Needs ``available()``."""
    open_, close, entry = _entry()
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
    try:
        return entry.Function(handle.value, alignment, num_outputs)  # it closes the handle when it goes
    except BaseException:
        close(handle.value)
        raise
