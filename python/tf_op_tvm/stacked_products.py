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

A group is stacked when its products are of at most a register tile of the
matmul schedule's rows (one row each, at batch 1: a matrix-vector product
reads all of W for one row), it takes at least two slices and at least half
of those along its axis (the stacked product computes them all), and the
shapes are static. The stacked product runs on the rows flattened to a
matrix, which the matmul schedule tiles several rows at a time, on one
thread (``STACKED_PRODUCT`` says why). The LSTM classifier at batch 1: 55
to 37 µs a call in TVM's VM, 118 to 91 through the op (each in one process,
turn about), 4 kernels a step instead of 5, the outputs the same to the bit.

Where a step adds its slice to a product of its own (the LSTM's recurrent
product at batch 8, ``slice + h @ U + b``), FuseOps leaves the slice a
kernel of its own: it fuses no producer into a product's epilogue.
``group_steps`` makes the three one function, which the matmul rule
schedules with the slice read in its epilogue: the LSTM at batch 8, 160
kernels a call to 98, 1.10x in TVM's VM (turn about).
"""

from __future__ import annotations

import math
from typing import Any

if __package__:
    from tf_op_tvm.cpu_schedule.matmul import MAX_TILE_ROWS, ONE_THREAD
else:  # run by path, as compile_model is
    from cpu_schedule.matmul import MAX_TILE_ROWS, ONE_THREAD

#: Fewest products of one group worth a stacked product.
MIN_GROUP = 2

#: The attribute of a stacked product's loop nest, by which ``group_steps``
#: finds it. The matmul rule keeps it on one thread (``ONE_THREAD``): it runs
#: once among the recurrence's serial steps, when TVM's workers have gone to
#: sleep, and waking them cost more than they saved (the LSTM's at batch 8:
#: 34.9 µs in the model on two threads, 11.8 alone, 18.3 on one).
STACKED_PRODUCT = "tvmdsoop.stacked_product"


def stack_sliced_products(mod: Any) -> Any:
    """``mod`` with each group of ``matmul(take(x, i, axis), W)``, by one
    matrix ``W`` and constant indices ``i``, one ``x @ W`` sliced at each
    ``i``; the kernels no longer used removed. Each ``x @ W`` is a loop nest
    of its own already (``STACKED_PRODUCT``), TOPI's as LegalizeOps writes it."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, index, weight = wildcard(), is_const(), wildcard()
    row = is_op("relax.take")(x, index)
    product = is_op("relax.matmul")(row, weight)

    def key(matched: dict[Any, Any]) -> tuple[int, int, int] | None:
        return group_key(matched[x], matched[index], matched[weight], matched[row].attrs.axis)

    # Each stacked product's loop nest, by its types. A BlockBuilder names
    # them and gives their GlobalVars the type a call_tir of them needs.
    products: dict[tuple[Any, ...], Any] = {}
    builder = relax.BlockBuilder()

    def product_of(matrix: list[int], dtype: str, w: Any, out_dtype: str) -> Any:
        types = (tuple(matrix), dtype, tuple(int(d) for d in w.ty.shape), str(w.ty.dtype), out_dtype)
        if types not in products:
            nest = _product_loop_nest(relax.TensorType(matrix, dtype), w.ty, out_dtype)
            products[types] = builder.add_func(nest.with_attrs({STACKED_PRODUCT: True, ONE_THREAD: True}),
                                               "stacked_product")
        return products[types]

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
            # x's rows flattened to a matrix (rows, K): ``rows`` above is the groups' slices.
            matrix = [math.prod(shape[:-1]), shape[-1]]
            out = relax.TensorType([matrix[0], int(w.ty.shape[1])], call.ty.dtype)
            whole = relax.call_tir(product_of(matrix, str(data.ty.dtype), w, str(call.ty.dtype)),
                                   [relax.op.reshape(data, matrix), w], out)
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
    mod = tvm.transform.Sequential([rewrite, relax.transform.EliminateCommonSubexpr(),
                                    relax.transform.DeadCodeElimination()])(mod)
    made = builder.get()
    for gvar in products.values():
        mod[gvar] = made[gvar]
    return mod


def _product_loop_nest(a: Any, b: Any, out_dtype: str) -> Any:
    """The loop nest LegalizeOps makes of ``matmul(a, b)`` for these types."""
    import tvm
    from tvm import relax

    builder = relax.BlockBuilder()
    params = [relax.Var("a", a), relax.Var("b", b)]
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.op.matmul(*params, out_dtype=out_dtype))
        builder.emit_func_output(out)
    legal = relax.transform.LegalizeOps()(builder.get())
    (nest,) = [f for f in legal.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return nest


def group_key(data: Any, index: Any, weight: Any, axis: int | None) -> tuple[int, int, int] | None:
    """What a product of ``take(data, index, axis)`` by ``weight`` is grouped
    by: the two tensors and the extent along the axis; None where it cannot
    be stacked (``weight`` not a matrix, an index that is not one scalar, the
    axis the products sum over, a shape not static, products of
    more than ``MAX_TILE_ROWS`` rows)."""
    import tvm

    dims, weights = data.ty, weight.ty
    if (dims.shape is None or weights.shape is None or weights.ndim != 2 or dims.ndim < 2
            or index.ty.ndim != 0 or axis is None
            or not all(isinstance(d, tvm.tirx.IntImm) for d in [*dims.shape, *weights.shape])):
        return None
    axis = int(axis) % dims.ndim
    extents = [int(d) for d in dims.shape]
    # Products of more rows than the matmul schedule's register tiles hold
    # read W once for many rows already. At a tile's rows (the LSTM at batch
    # 8), stacked alone, the LSTM was even in TVM's VM (151 µs a call against
    # 153); with its steps grouped (group_steps) and the stacked product on
    # one thread, 1.10x.
    if axis == dims.ndim - 1 or math.prod(extents[:-1]) // extents[axis] > MAX_TILE_ROWS:
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


def group_steps() -> Any:
    """A module pass: each ``reshape(slice(stacked)) + x @ W + b``, a step
    adding its slice of a stacked product to a product of its own, one
    function (FuseOpsByPattern), which the matmul rule schedules with the
    slice and the bias read in its epilogue."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_op, wildcard
    from tvm.relax.transform import FusionPattern

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.GroupSteps")
    def group(mod: Any, _ctx: Any) -> Any:
        stacked = {gvar for gvar, func in mod.functions.items()
                   if func.attrs is not None and func.attrs.get(STACKED_PRODUCT)}
        if not stacked:
            return mod
        # The variables that hold a stacked product (reshaped back to its rows).
        holders: set[Any] = set()

        def op(value: Any) -> str | None:
            return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None

        for func in mod.functions.values():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:  # in order: a reshape's source is held before it
                for binding in block.bindings:
                    value = binding.value
                    if ((op(value) == "relax.call_tir" and any(value.args[0].same_as(g) for g in stacked))
                            or (op(value) == "relax.reshape" and any(value.args[0].same_as(v) for v in holders))):
                        holders.add(binding.var)
        slice_ = is_op("relax.strided_slice")(wildcard(), wildcard(), wildcard(), wildcard())
        step = is_op("relax.add")(is_op("relax.add")(is_op("relax.reshape")(slice_, wildcard()),
                                                     is_op("relax.matmul")(wildcard(), wildcard())), wildcard())

        def of_a_stacked_product(context: Any) -> bool:
            source = context.annotated_expr["slice"].args[0]
            return any(source.same_as(v) for v in holders)

        pattern = FusionPattern("tvmdsoop.step", step, {"slice": slice_}, of_a_stacked_product)
        return relax.transform.FuseOpsByPattern([pattern], bind_constants=False)(mod)

    return group
