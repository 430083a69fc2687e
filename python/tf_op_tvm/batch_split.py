"""A batch of independent samples run as calls of the model at a smaller batch
(``split_batch``).

A convolutional network at batch 8 passes each layer's activation for all 8
images before the next layer starts: MobileNetV2's 112x112x96 activations are
38 MB at batch 8, and every layer streams its input and output through memory.
At batch 1 the same activation is 4.8 MB and stays in the caches between one
layer and the next. So where no operation mixes the samples of a batch (each
output row depends on the same input row only), ``main`` becomes calls of the
model at a chunk of the batch, each on a copy of its rows of the inputs, the
outputs concatenated. At batch 8 through the op on a Zen 4 of 2 cores (one
process, turn about, medians of 16 and 10 rounds): MobileNetV2 1.14 times as
fast (TFLite / ours 0.93 to 1.02), ResNet50 1.06 (1.01 to 1.07), the outputs
the same to the bit (each sample's sums run in the same order at any batch).
It trades memory traffic: each call reads the weights again (ResNet50's 100 MB
eight times), against activations that no longer leave the caches.

A chunk is the most samples whose largest activation fits ``ACTIVATION_BUDGET``;
a model whose activations at the whole batch fit it (the small CNN at batch 32)
is left alone, since each call of a chunk costs the VM's per-call work and
narrows the products a register tile spans.

What keeps samples apart is checked operation by operation (``_rows``), on
the batch as axis 0: an operation this module does not know, a weight that is
an input, a batch axis that moves (the transformer block's, merged with the
heads for its attention products; the LSTM's, time-major), and the model stays
whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: Bytes of a call's largest activation that stay in a core's caches between
#: layers: 4 MiB runs ResNet50 and MobileNetV2 at 224x224 (3.2 and 4.8 MB an
#: image) one image a call, and leaves the small models of the peers benchmark
#: whole.
ACTIVATION_BUDGET = 4 << 20

#: Most calls ``main`` makes: each is code in the library and work for the VM.
MAX_CALLS = 64

#: Operations that compute each element from the same position of their
#: operands (NumPy broadcasting).
_ELEMENTWISE = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum", "negative", "abs",
    "exp", "log", "sqrt", "rsqrt", "square", "tanh", "sigmoid", "erf", "clip", "nn.relu", "nn.gelu",
    "nn.gelu_tanh", "nn.silu", "nn.leakyrelu", "round", "floor", "ceil", "sign", "astype", "where"))

#: Operations on images whose layout attr names the batch axis ``N``.
_IMAGE_OPS = {"relax.nn.conv2d": ("data_layout", "out_layout"), "relax.nn.max_pool2d": ("layout", "out_layout"),
              "relax.nn.avg_pool2d": ("layout", "out_layout")}

#: Operations over the axes their ``axis`` attr names.
_AXIS_OPS = frozenset(f"relax.{name}" for name in ("mean", "sum", "max", "min", "prod", "nn.softmax",
                                                  "nn.log_softmax"))


def split_batch(mod: Any, say: Callable[[str], None] = lambda _: None) -> Any:
    """``mod`` with ``main`` calling itself at a chunk of its batch, where that
    keeps each call's activations within ``ACTIVATION_BUDGET`` and no operation
    mixes samples (``say`` tells how it split it); else ``mod`` as it is."""
    func = mod["main"]
    batch = _batch(func)
    samples = _samples(func, batch) if batch is not None else None
    if samples is None:
        return mod
    rows, largest = samples
    chunk = _chunk(batch, largest)
    if chunk == batch:
        return mod
    say(f"runs batch {batch} as {batch // chunk} calls of {chunk} sample{'s' if chunk > 1 else ''}, whose "
        f"largest activation is {largest * chunk / 2**20:.1f} MiB")
    return _split(mod, func, rows, batch, chunk)


def _batch(func: Any) -> int | None:
    """The batch of ``main``: the first dimension, above 1, static, of every
    input (one dataflow block, as TVM's frontends make it)."""
    from tvm import relax

    if not func.params or len(func.body.blocks) != 1 or not isinstance(func.body.blocks[0], relax.DataflowBlock):
        return None
    firsts = {_static_shape(p.ty)[0] if _static_shape(p.ty) else None for p in func.params}
    if len(firsts) != 1 or None in firsts:
        return None
    batch = firsts.pop()
    return batch if batch > 1 else None


def _static_shape(ty: Any) -> list[int] | None:
    """The static shape of a tensor of rank 1 or more, else None."""
    from tvm import relax, tirx

    if not isinstance(ty, relax.TensorType) or ty.shape is None or ty.ndim < 1:
        return None
    dims = getattr(ty.shape, "values", None)
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def _samples(func: Any, batch: int) -> tuple[set[Any], int] | None:
    """The variables whose axis 0 is the batch, sample by sample, and the bytes
    of one sample of the largest; None where an operation mixes samples (or is
    one this module does not know) or an output is not the batch's."""
    import tvm
    from tvm import relax

    rows: set[Any] = set(func.params)
    largest = 0
    for binding in func.body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Tuple):  # the outputs, gathered
            if not all(f in rows for f in value.fields):
                return None
            rows.add(binding.var)
            continue
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        operands = [f for a in value.args for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
        if not any(o in rows for o in operands):
            continue  # computed from constants alone: the same for every sample
        shape = _static_shape(binding.var.ty)
        if shape is None or shape[0] != batch or not _rows(value, rows, batch):
            return None
        rows.add(binding.var)
        largest = max(largest, _sample_bytes(binding.var.ty, batch))
    body = func.body.body
    return (rows, largest) if isinstance(body, relax.Var) and body in rows else None


def _rows(call: Any, rows: set[Any], batch: int) -> bool:
    """Whether each sample of ``call``'s output (of shape [batch, ...]) reads
    only the same sample of the operands in ``rows`` (the others are constants'
    work, the same for every sample)."""
    from tvm import relax

    name = call.op.name
    tensors = [a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
    out_rank = call.ty.ndim

    def broadcast_apart() -> bool:
        # A batch operand keeps axis 0 at the output's; a constant one does not
        # reach it (of lower rank, or of 1 there).
        for t in tensors:
            shape = _static_shape(t.ty)
            if t in rows and (shape is None or len(shape) != out_rank or shape[0] != batch):
                return False
            if t not in rows and shape is not None and len(shape) == out_rank and shape[0] != 1:
                return False
        return True

    if name in _ELEMENTWISE:
        return broadcast_apart()
    if name in _IMAGE_OPS:
        layout, out_layout = (str(getattr(call.attrs, a, "") or "") for a in _IMAGE_OPS[name])
        return (layout.startswith("N") and (out_layout or layout).startswith("N") and call.args[0] in rows
                and all(a not in rows for a in call.args[1:]))
    if name in _AXIS_OPS:
        axes = call.attrs.axis
        axes = [axes] if isinstance(axes, int) or hasattr(axes, "value") else axes
        rank = _static_rank(call.args[0])
        if axes is None or rank is None:
            return False  # over every axis: the batch's too
        return all(int(a) % rank != 0 for a in axes)
    if name == "relax.reshape":
        return True  # row-major, and axis 0 is the batch before and after: each sample's block maps to itself
    if name == "relax.permute_dims":
        return call.attrs.axes is not None and int(call.attrs.axes[0]) == 0
    if name == "relax.matmul":
        return _matmul_rows(call, rows, batch)
    if name == "relax.strided_slice":
        rank = _static_rank(call.args[0])
        return rank is not None and all(int(a.value) % rank != 0 for a in call.args[1].fields)
    if name == "relax.nn.pad":
        return [int(w) for w in call.attrs.pad_width[:2]] == [0, 0]
    return False


def _static_rank(expr: Any) -> int | None:
    shape = _static_shape(expr.ty)
    return len(shape) if shape else None


def _matmul_rows(call: Any, rows: set[Any], batch: int) -> bool:
    """A product keeps samples apart where the batch is the rows of a matrix
    times a constant one, or a stacking axis of both operands."""
    a, b = call.args
    a_shape, b_shape = _static_shape(a.ty), _static_shape(b.ty)
    if a_shape is None or b_shape is None:
        return False
    if a in rows and b in rows:
        return len(a_shape) == len(b_shape) >= 3
    stacked, other = (a_shape, b_shape) if a in rows else (b_shape, a_shape)
    if len(stacked) == 2:
        return a in rows and len(other) == 2  # rows of x, by W
    return len(other) < len(stacked) or other[0] == 1


def _chunk(batch: int, largest: int) -> int:
    """The most samples a call takes: a divisor of ``batch`` within the budget
    (one sample where one is over it), within ``MAX_CALLS`` calls."""
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    fitting = [d for d in divisors if d * largest <= ACTIVATION_BUDGET] or [1]
    return next(d for d in divisors if d >= fitting[-1] and batch // d <= MAX_CALLS)


def _split(mod: Any, func: Any, rows: set[Any], batch: int, chunk: int) -> Any:
    """``mod`` with the model at ``chunk`` samples a private function,
    ``main_chunk``, and ``main`` calling it on a copy of each chunk's rows of
    the inputs (TVM's kernels take no tensor at an offset, which a view is),
    its outputs concatenated."""
    import tvm
    from tvm import relax

    others = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}
    bb = relax.BlockBuilder(tvm.IRModule(others, attrs=mod.attrs, global_infos=mod.global_infos))
    chunk_params = [relax.Var(p.name, _resized(p.ty, chunk)) for p in func.params]
    body = func.body.body
    with bb.function("main_chunk", chunk_params, private=True):
        with bb.dataflow():
            mapped = dict(zip(func.params, chunk_params))
            for binding in func.body.blocks[0].bindings:
                value = _resized_value(binding.value, mapped, rows, chunk)
                mapped[binding.var] = (bb.emit_output if binding.var is body else bb.emit)(value)
        chunk_main = bb.emit_func_output(mapped[body])
    outputs = len(body.ty.fields) if isinstance(body.ty, relax.TupleType) else None
    params = [relax.Var(p.name, p.ty) for p in func.params]
    with bb.function("main", params, attrs=dict(func.attrs) if func.attrs else None):
        with bb.dataflow():
            results = []
            for start in range(0, batch, chunk):
                rows_of = [bb.emit(relax.op.strided_slice(p, axes=[0], begin=[start], end=[start + chunk]))
                           for p in params]
                results.append(bb.emit(relax.Call(chunk_main, rows_of)))
            if outputs is None:
                out = bb.emit_output(relax.op.concat(results, axis=0))
            else:
                out = bb.emit_output(relax.Tuple([
                    bb.emit(relax.op.concat([bb.emit(relax.TupleGetItem(r, i)) for r in results], axis=0))
                    for i in range(outputs)]))
        bb.emit_func_output(out)
    return bb.get()


def _resized(ty: Any, first: int) -> Any:
    from tvm import relax

    return relax.TensorType([first, *_static_shape(ty)[1:]], ty.dtype)


def _sample_bytes(ty: Any, batch: int) -> int:
    return math.prod(_static_shape(ty)) // batch * _itemsize(ty)


def _itemsize(ty: Any) -> int:
    import tvm

    dtype = tvm.DataType(str(ty.dtype))
    return (dtype.bits * dtype.lanes + 7) // 8


def _resized_value(value: Any, mapped: dict[Any, Any], rows: set[Any], chunk: int) -> Any:
    """``value`` on the chunk's variables; a reshape of the batch's rows to the
    chunk's."""
    from tvm import relax

    def arg(a: Any) -> Any:
        if isinstance(a, relax.Var):
            return mapped[a]
        if isinstance(a, relax.Tuple):
            return relax.Tuple([arg(f) for f in a.fields])
        return a

    if isinstance(value, relax.Tuple):
        return arg(value)
    args = [arg(a) for a in value.args]
    if value.op.name == "relax.reshape" and value.args[0] in rows:
        args[1] = relax.ShapeExpr([chunk, *list(value.args[1].values)[1:]])
    return relax.Call(value.op, args, value.attrs, value.ty_args)
