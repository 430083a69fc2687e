"""The layout changes TFLite puts on weights that are inputs, undone in Relax.

TFLite's kernels take their weights in layouts of their own: CONV_2D's as OHWI,
DEPTHWISE_CONV_2D's as 1HWC, FULLY_CONNECTED's as (N, K). When a weight is a
constant, TF's converter stores it in that layout; when it is an input of the
function (a Keras weight that ``tf_op.auto`` leaves to TF's ReadVariableOp), the
converter puts a TRANSPOSE or RESHAPE in front of the op, and TVM's frontend
then changes the layout back to the one its Relax operator takes (HWIO, HWOI,
(K, N)). Constant, the two fold away at compile time; as inputs, they are two
copies of every weight on every call (ResNet50: 100 MB each way). A
BATCH_MATMUL by a 2-D weight (a Keras Dense layer on a sequence) gets the
weight broadcast to the batch in front of the product: a copy per batch item.

``simplify`` composes consecutive ``permute_dims`` and drops one that leaves the
axes where they were, gives ``matmul`` the weight itself rather than its
broadcast (matmul broadcasts it), and lets Relax merge and drop redundant
reshapes (``RemoveRedundantReshape``). Nothing here changes a value: every
rewrite moves the same elements, or none.
"""

from __future__ import annotations

from typing import Any


def simplify(mod: Any) -> Any:
    """``mod`` with the weight layout changes described above undone."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    x, a = wildcard(), wildcard()
    inner = is_op("relax.permute_dims")(x)
    twice = is_op("relax.permute_dims")(inner)
    broadcast = is_op("relax.broadcast_to")(x, wildcard())
    product = is_op("relax.matmul")(a, broadcast)

    def compose(call: Any, matched: dict[Any, Any]) -> Any:
        source = matched[x]
        rank = source.ty.ndim
        first, second = (_axes(matched[p].attrs.axes, rank) for p in (inner, twice))
        axes = [first[i] for i in second]
        return source if axes == list(range(rank)) else relax.op.permute_dims(source, axes)

    def unbroadcast(call: Any, matched: dict[Any, Any]) -> Any:
        source = matched[x]
        shape, target = _static_shape(source), _static_shape(matched[broadcast])
        # Only leading dimensions added: matmul broadcasts a B of lower rank itself.
        if shape is None or target is None or len(shape) < 2 or target[len(target) - len(shape):] != shape:
            return call
        return relax.op.matmul(matched[a], source, out_dtype=call.attrs.out_dtype)

    @relax.transform.function_pass(opt_level=0, name="tvmdsoop.SimplifyWeightLayouts")
    def rewrite(func: Any, _mod: Any, _ctx: Any) -> Any:
        return rewrite_call(product, unbroadcast, rewrite_call(twice, compose, func))

    return tvm.transform.Sequential([rewrite, relax.transform.RemoveRedundantReshape(),
                                     relax.transform.DeadCodeElimination()])(mod)


def _axes(axes: Any, rank: int) -> list[int]:
    """``permute_dims``'s axes, where None means reversed."""
    return list(range(rank))[::-1] if axes is None else [int(a) for a in axes]


def _static_shape(expr: Any) -> list[int] | None:
    from tvm import relax, tirx

    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = ty.shape.values
    return [int(n) for n in dims] if all(isinstance(n, tirx.IntImm) for n in dims) else None
