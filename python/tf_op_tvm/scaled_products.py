"""A product's scale as its epilogue: ``scale_before_reshape``, a Relax pass
before legalization.

Keras's attention scales its scores after their product, and TFLite's
converter writes that batched product of Q and K^T over heads times batch,
reshaped back to (batch, heads, T, T) before the scale:
``multiply(reshape(matmul(q, k)), 0.177)``. FuseOps makes the elementwise work
right after a product its epilogue, but the reshape between them is not
elementwise: the scale ran as a kernel of its own, one more pass over the
scores. A multiply by a scalar commutes with any reshape, so the pass moves it
before: ``reshape(multiply(matmul(q, k), 0.177))``, each value the same to the
bit, the scale computed on the product's tile and the reshape a view.
"""

from __future__ import annotations

from typing import Any


def scale_before_reshape() -> Any:
    """The pass: in every function, a product reshaped then multiplied by a
    scalar constant is multiplied first."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    product = is_op("relax.matmul")(wildcard(), wildcard())
    reshaped = is_op("relax.reshape")(product, wildcard())
    scale = is_const()
    scaled = is_op("relax.multiply")(reshaped, scale) | is_op("relax.multiply")(scale, reshaped)

    def rewrite(call: Any, matched: dict[Any, Any]) -> Any:
        factor = matched[scale]
        if factor.ty.ndim != 0:
            return call  # a tensor broadcasts along the reshaped axes
        return relax.op.reshape(relax.op.multiply(matched[product], factor), matched[reshaped].args[1])

    @relax.transform.function_pass(opt_level=0, name="tvmdsoop.ScaleBeforeReshape")
    def scale_first(func: Any, _mod: Any, _ctx: Any) -> Any:
        return rewrite_call(scaled, rewrite, func)

    return scale_first
