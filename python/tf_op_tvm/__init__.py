"""tf_op_tvm: the TVM side of tf_op, for the processes that run TVM's compiler.

It imports TVM and never TensorFlow (their LLVMs clash in one process), and tf_op
never imports it: run it where ``tvm.compile`` runs.

    from tf_op_tvm import add_gradient
    mod = add_gradient(mod, "forward")                  # adds forward_grad

Its modules:
  gradient       ``add_gradient``, for a script that builds a model with TVM
  compile_model  the worker ``tf_op.compile`` runs by path on the TVM Python:
                 a TFLite flatbuffer in, a Relax VM library out
  math_lowering  the worker's exp and log for CPU code, which LLVM vectorizes
  defops         ``defop``: TF ops written with TVM's tensor expressions
                 (docs/defop.md); build_ops builds a file of them

Importing the package imports TVM (``add_gradient`` needs it); the worker's
modules import it only where they use it, so ``compile_model.py --version``
answers without it.
"""

from tf_op_tvm.defops import defop
from tf_op_tvm.gradient import add_gradient

__all__ = ["add_gradient", "defop"]
