"""tf_op: call functions of TVM-compiled libraries inside TensorFlow graphs.

    import tf_op
    add_one = tf_op.Module("add_one.so").func("add_one")
    y = add_one(tf.constant([1.0, 2.0]))

Each call adds a TVMDSOOp to the graph (or runs it, in eager mode). TensorFlow's
buffers go to TVM as DLPack tensors without a copy.

Importing the package loads the op library and registers the op's gradient, so
that graphs and SavedModels holding TVMDSOOp nodes load, run and train after a
plain ``import tf_op``.
"""

from types import ModuleType

from tf_op import _library, auto, gradients  # noqa: F401 - registers TVMDSOOp's gradient
from tf_op._library import BuildMismatchError, library_path
from tf_op._version import __version__
from tf_op.compiler import CompiledFunction, CompileError, compile  # noqa: A004 - tf_op.compile is the API
from tf_op.defops import DefOp, Ops, load_ops
from tf_op.keras_layer import ModelLayer
from tf_op.module import Func, Module, OpModule

__all__ = [
    "BuildMismatchError", "CompileError", "CompiledFunction", "DefOp", "Func", "ModelLayer", "Module", "OpModule", "Ops",
    "__version__", "auto", "compile", "library_path", "load_ops", "ops",
]

_library.load()


def ops() -> ModuleType:
    """The generated op wrappers of the library (``ops().tvmdso_op``)."""
    return _library.load()
