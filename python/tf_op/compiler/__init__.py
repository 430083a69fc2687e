"""``tf_op.compile``: TVM as a compiler for TensorFlow functions and Keras models.

    fast = tf_op.compile(model, input_signature=[tf.TensorSpec([None, 28, 28, 1])])
    y = fast(x)        # a TVMDSOOp running the TVM-compiled model; eager or in tf.function

The route: the function is traced for a fully static input shape, TF's TFLite
converter freezes it into a flatbuffer (in this process), and a child process on
the TVM Python (``TVMDSOOP_TVM_PYTHON``, default this Python) runs the worker,
``tf_op_tvm/compile_model.py``: ``relax.frontend.tflite`` -> ``tvm.compile`` ->
``export_library``. TVM's compiler never loads here: its LLVM clashes with TF's.

Each static input shape is compiled once and kept in a content-addressed cache
folder, so a second process (a server restart) loads instead of compiling; the
key comes from the traced function, so a hit does not convert to TFLite either.

One concept a module:
  api                ``compile``: the arguments checked, the defaults chosen
  compiled_function  ``CompiledFunction``: a library per static input shape, and
                     the dispatch among them
  tflite_conversion  a traced function -> a TFLite flatbuffer, and the fingerprint
                     of what that reads (keys the cache before converting)
  targets            TVM targets: the default and the host target, their kinds,
                     ``"native"`` resolved to this CPU
  cache              the cache folder (``TVMDSOOP_CACHE_DIR``): keys and entries
  worker             the TVM process: located without importing it, and run
  errors             ``CompileError``

All of them log on the logger ``tf_op.compiler``.
"""

from tf_op.compiler.api import DEFAULT_TUNING_TRIALS, compile  # noqa: A004 - tf_op.compile is the API
from tf_op.compiler.compiled_function import CompiledFunction, Shapes
from tf_op.compiler.errors import CompileError
from tf_op.compiler.targets import DEFAULT_TARGET, HOST_TARGET, Target

__all__ = [
    "DEFAULT_TARGET", "DEFAULT_TUNING_TRIALS", "HOST_TARGET", "CompileError", "CompiledFunction", "Shapes", "Target",
    "compile",
]
