"""Products of one matrix by many slices of one tensor as one product, sliced
after (``stack_sliced_products``).

An RNN unrolled step by step (tf_op.compile unrolls loops of a known number of
steps) multiplies each step's input ``take(x, t)`` by the same input weights
``W``: 32 small products and the 32 ``take`` kernels that feed them, each a
kernel call and a tensor for TVM's VM to make. None of them depends on the
recurrence, so, as cuDNN and TFLite's LSTM kernels do, one product of every
step's input, ``x @ W``, computes them all at once and each step takes its row
of it, a slice that FuseOps fuses into the step's kernel. With ``W`` a matrix
each output row of a product is the same dot products in the same order
whichever rows are computed beside it, so results are the same to the bit.

A group is stacked when its products are of fewer rows than a register tile
of the matmul schedule (one row each, at batch 1: a matrix-vector product
reads all of W for one row), it takes at least two slices and at least half
of those along its axis (the stacked product computes them all), and the
shapes are static. The stacked product runs on the rows flattened to a
matrix, which the matmul schedule tiles several rows at a time. The LSTM
classifier at batch 1: 55 to 37 µs a call in TVM's VM, 118 to 91 through the
op (each in one process, turn about), 4 kernels a step instead of 5, the
outputs the same to the bit.
"""

from __future__ import annotations

import math
from typing import Any

if __package__:
    from tf_op_tvm.cpu_schedule.matmul import MAX_TILE_ROWS
else:  # run by path, as compile_model is
    from cpu_schedule.matmul import MAX_TILE_ROWS

#: Fewest products of one group worth a stacked product.
MIN_GROUP = 2


def stack_sliced_products(mod: Any) -> Any:
    """``mod`` with each group of ``matmul(take(x, i, axis), W)``, by one
    matrix ``W`` and constant indices ``i``, one ``x @ W`` sliced at each
    ``i``; the kernels no longer used removed."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, index, weight = wildcard(), is_const(), wildcard()
    row = is_op("relax.take")(x, index)
    product = is_op("relax.matmul")(row, weight)

    def key(matched: dict[Any, Any]) -> tuple[int, int, int] | None:
        return group_key(matched[x], matched[index], matched[weight], matched[row].attrs.axis)

    @relax.transform.function_pass(opt_level=0, name="tvmdsoop.StackSlicedProducts")
    def rewrite(func: Any, _mod: Any, _ctx: Any) -> Any:
        rows: dict[tuple[int, int, int], set[int]] = {}

        def record(call: Any, matched: dict[Any, Any]) -> Any:
            if (k := key(matched)) is not None:
                i = scalar(matched[index])
                # An index out of range (TFLite's GATHER leaves it undefined): the group stays as it is.
                rows.setdefault(k, set()).add(i if 0 <= i < k[2] else -1)
            return call

        rewrite_call(product, record, func)
        stacked = {k for k, taken in rows.items() if -1 not in taken and worth_stacking(len(taken), k[2])}

        def stack(call: Any, matched: dict[Any, Any]) -> Any:
            k = key(matched)
            if k not in stacked:
                return call
            data, w = matched[x], matched[weight]
            shape = [int(d) for d in data.ty.shape]
            flat = relax.op.reshape(data, [-1, shape[-1]])
            whole = relax.op.matmul(flat, w, out_dtype=call.attrs.out_dtype)
            rows_out = relax.op.reshape(whole, [*shape[:-1], int(w.ty.shape[1])])
            # A slice and a reshape, not a take: FuseOps fuses those into the
            # step's kernel, where a take (an index read from a tensor) stays
            # a kernel of its own.
            i, axis = scalar(matched[index]), int(matched[row].attrs.axis) % len(shape)
            part = relax.op.strided_slice(rows_out, axes=[axis], begin=[i], end=[i + 1])
            return relax.op.reshape(part, [int(d) for d in call.ty.shape])

        return rewrite_call(product, stack, func)

    # The products of one group are the same call of the same variables:
    # EliminateCommonSubexpr keeps the first.
    return tvm.transform.Sequential([rewrite, relax.transform.EliminateCommonSubexpr(),
                                     relax.transform.DeadCodeElimination()])(mod)


def group_key(data: Any, index: Any, weight: Any, axis: int | None) -> tuple[int, int, int] | None:
    """What a product of ``take(data, index, axis)`` by ``weight`` is grouped
    by: the two tensors and the extent along the axis; None where it cannot
    be stacked (``weight`` not a matrix, an index that is not one scalar, the
    axis the products sum over, a shape not static, products of
    ``MAX_TILE_ROWS`` rows or more)."""
    import tvm

    dims, weights = data.ty, weight.ty
    if (dims.shape is None or weights.shape is None or weights.ndim != 2 or dims.ndim < 2
            or index.ty.ndim != 0 or axis is None
            or not all(isinstance(d, tvm.tirx.IntImm) for d in [*dims.shape, *weights.shape])):
        return None
    axis = int(axis) % dims.ndim
    extents = [int(d) for d in dims.shape]
    # Products of as many rows as the matmul schedule's register tiles hold
    # read W once for that many rows already: the LSTM at batch 8, stacked,
    # was even in TVM's VM (151 µs a call against 153) and slower through the
    # op (268 against 215), in one process, turn about.
    if axis == dims.ndim - 1 or math.prod(extents[:-1]) // extents[axis] >= MAX_TILE_ROWS:
        return None
    return data.__chandle__(), weight.__chandle__(), extents[axis]


def scalar(constant: Any) -> int:
    """A scalar constant's value (TVM's ``GenericConst`` holds a 0-d tensor)."""
    value = constant.value
    return int(value if isinstance(value, int) else value.numpy())


def worth_stacking(taken: int, extent: int) -> bool:
    """Whether products of ``taken`` rows of ``extent`` are worth one product
    of them all: at least ``MIN_GROUP``, and at least half of them."""
    return taken >= MIN_GROUP and 2 * taken >= extent
