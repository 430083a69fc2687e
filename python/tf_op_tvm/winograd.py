"""3x3 convolutions of stride 1 as Winograd's minimal filtering, F(m x m, 3 x 3)
(Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015):
``winograd_convolutions``, a Relax pass before legalization.

ResNet50 runs at the machine's peak already: on a 2-core Zen 4 (233 GFLOP/s
with AVX-512 FMAs) its untuned library took 38 ms a call for 8.2 GFLOP, 215
GFLOP/s, and so did TFLite+XNNPACK and ONNX Runtime, within a few percent.
Only fewer operations make it faster, and half of them are its 3x3
convolutions. Winograd's algorithm computes each m x m tile of such a
convolution's output from an (m + 2) x (m + 2) tile of its input with
(m + 2)^2 multiplications per pair of channels instead of 9 m^2: 4 times fewer
for m = 4, 2.25 for m = 2. The input's tiles are transformed (``B^T d B``), the
weights once, at compile time (``G g G^T``), and the products of the two,
summed over input channels, are (m + 2)^2 matrix products, which the matmul
schedule runs near the peak; the output transform (``A^T M A``) takes the
convolution's epilogue (bias, activation, residual add). Each ResNet50 layer
alone, AVX-512, TVM's VM, the direct schedule against F(4 x 4): 56x56x64
1047 -> 367 µs, 28x28x128 1043 -> 339, 14x14x256 1035 -> 447 (F(2 x 2): 487).
In the whole model, whose transformed weights come from memory rather than a
warm cache, fewer layers gain (``MIN_TILES``): ResNet50 at batch 1 1.23-1.26
times as fast with its 56x56 and 28x28 layers at m = 4, 14x14 at m = 2, 7x7
direct.

The price is rounding: the transforms' coefficients (up to 8 and 1/24 for
m = 4) make each output a longer sum of larger terms. Each layer alone, the
largest difference from the direct convolution, relative to the largest
output: 1e-6 to 3e-6 for m = 2, 4e-6 to 1.2e-5 for m = 4; the issue's budget
for a whole model's logits is 1e-4 of TF's. ``TVMDSOOP_WINOGRAD=0`` keeps the
direct convolutions (and is part of tf_op.compile's cache key).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

if __package__:
    from tf_op_tvm.cpu_schedule.winograd import TRANSFORM_KEY
else:  # run by path, as compile_model is
    from cpu_schedule.winograd import TRANSFORM_KEY

#: Set to 0, compiles keep every convolution direct (tf_op.compile's cache
#: key holds it).
WINOGRAD_ENV = "TVMDSOOP_WINOGRAD"

#: Fewest tiles (over the batch) a layer's matrix products must have rows
#: for. Each of the (m + 2)^2 transformed weight matrices is read once a call,
#: from memory in a whole model (ResNet50's: 117 MB with every 3x3 layer
#: converted, 45 MB direct), for as many rows as tiles: with too few, the
#: reads cost what the products save. ResNet50 at batch 1, in one process,
#: turn about, direct / converted: 16 (its 7x7 layers at m = 2, 14x14 at 4)
#: 1.09-1.20; 32 (7x7 direct, 14x14 at 2, 28x28 and 56x56 at 4) 1.23-1.26;
#: 50 (28x28 at 2 too) 1.13.
MIN_TILES = 32

#: Fewest input and output channels: the products sum over the input channels
#: and are as wide as the output's; a layer of 3 input channels (an image)
#: has little to sum.
MIN_CHANNELS = 32

#: Least ratio of the direct convolution's multiplications to Winograd's
#: (counting the tiles' parts past the output's edge) for a layer to be
#: converted: a batch of outputs smaller than a tile would have enough tiles
#: and no saving.
MIN_SAVING = 1.5

#: TVM's OpPatternKind values (relax/op_attr_types.h) that FuseOps reads
#: from a function's ``op_pattern``.
OUT_ELEMWISE_FUSABLE, OPAQUE = 4, 8

#: ``B^T`` (input), ``G`` (weights) and ``A^T`` (output) for each m, from the
#: interpolation points 0, 1, -1 (m = 2) and 0, 1, -1, 2, -2 (m = 4), and
#: infinity: Lavin and Gray's, and NNPACK's and TVM's old x86 ones.
MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], "float64"),
        np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]], "float64"),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], "float64")),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], "float64"),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], "float64"),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], "float64")),
}


def enabled() -> bool:
    """Whether compiles use the algorithm: ``WINOGRAD_ENV`` 1 or unset, not 0."""
    value = os.environ.get(WINOGRAD_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{WINOGRAD_ENV}={value!r}: expected 1 (3x3 convolutions as Winograd's, the default) "
                         "or 0 (all convolutions direct)")
    return value == "1"


def tile_size(batch: int, height: int, width: int) -> int | None:
    """The m of F(m x m, 3 x 3) for an output of ``batch`` x ``height`` x
    ``width``: the larger of 4 and 2 that leaves ``MIN_TILES`` tiles and
    saves ``MIN_SAVING`` times the multiplications, else None (the direct
    convolution)."""
    for m in (4, 2):
        tiles = batch * -(-height // m) * -(-width // m)
        if tiles >= MIN_TILES and (m + 2) ** 2 * tiles * MIN_SAVING <= 9 * batch * height * width:
            return m
    return None


def weight_transform(weight: np.ndarray, m: int) -> np.ndarray:
    """``G g G^T`` of each pair of channels of an HWIO 3x3 ``weight``, computed
    in float64: ((m + 2)^2, in, out) float32, the B of the products."""
    g = MATRICES[m][1]
    u = np.einsum("ai,ijco,bj->abco", g, weight.astype("float64"), g)
    return u.reshape(g.shape[0] ** 2, *weight.shape[2:]).astype("float32")


def winograd_convolutions(report: Callable[[str], None]) -> Any:
    """The pass: each convolution ``_convertible`` takes as the input
    transform, the matrix products and the output transform; ``report`` says
    how many."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    @mutator
    class Rewriter(PyExprMutator):  # type: ignore[misc]  (TVM's registered mutator base)
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.converted: dict[int, int] = {}

        def visit_call_(self, call: Any) -> Any:
            call = self.visit_expr_post_order(call)
            if not call.op.same_as(conv2d):
                return call
            found = _convertible(call)
            if found is None:
                return call
            pad, m = found
            self.converted[m] = self.converted.get(m, 0) + 1
            return _emit(self.builder_, call.args[0], call.args[1].value.numpy(), pad, m)

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.WinogradConvolutions")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        if not enabled():
            return mod
        rewriter = Rewriter(mod)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        if not rewriter.converted:
            return mod
        report("computed " + ", ".join(f"{n} 3x3 convolution{'s' * (n != 1)} as F({m}x{m}, 3x3)"
                                       for m, n in sorted(rewriter.converted.items(), reverse=True)))
        # Each converted call's variable is bound to the output transform's:
        # without that alias in between, FuseOps fuses the epilogue into it.
        return relax.transform.CanonicalizeBindings()(rewriter.builder_.get())

    return rewrite


def _convertible(call: Any) -> tuple[int, int] | None:
    """The padding and m of a ``conv2d`` the pass converts, else None: float32
    NHWC by a constant HWIO 3x3 weight, stride and dilation 1, one group, the
    same padding of 0 or 1 on every side, static shapes, ``MIN_CHANNELS``
    each way in whole SSE vectors, and ``tile_size`` tiles."""
    import tvm

    data, weight = call.args
    attrs = call.attrs
    if (not isinstance(weight, tvm.ir.GenericConst) or attrs.data_layout != "NHWC"
            or attrs.kernel_layout != "HWIO" or attrs.out_layout != "NHWC" or int(attrs.groups) != 1
            or [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]
            or attrs.out_dtype not in (None, "", "float32")):
        return None
    padding = {int(p) for p in attrs.padding}
    shape, kernel = data.ty.shape, weight.ty.shape
    if (len(padding) != 1 or not padding <= {0, 1} or data.ty.dtype != "float32" or weight.ty.dtype != "float32"
            or shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape)):
        return None
    (pad,) = padding
    n, h, w, c = (int(d) for d in shape)
    kh, kw, ci, co = (int(d) for d in kernel)
    if (kh, kw) != (3, 3) or ci != c or min(c, co) < MIN_CHANNELS or c % 4 or co % 4:
        return None
    m = tile_size(n, h + 2 * pad - 2, w + 2 * pad - 2)
    return None if m is None else (pad, m)


def _emit(builder: Any, data: Any, weight: np.ndarray, pad: int, m: int) -> Any:
    """The convolution of ``data`` by ``weight`` as F(m x m, 3 x 3), emitted
    into ``builder``: its output."""
    from tvm import relax

    n, h, w, _ = (int(d) for d in data.ty.shape)
    out_h, out_w = h + 2 * pad - 2, w + 2 * pad - 2
    tiles = (-(-out_h // m), -(-out_w // m))
    # FuseOps reads a function's pattern from its loop nests, and takes a
    # transform's two for an opaque function: the output transform is
    # declared what a convolution is, so that its elementwise epilogue joins
    # it (and no reshape or concatenation after it, which its schedule does
    # not take).
    v = builder.emit_te(input_transform, data, m, pad, tiles, primfunc_name_hint="winograd_input",
                        primfunc_attrs={"op_pattern": OPAQUE})
    products = builder.emit(relax.op.matmul(v, relax.const(weight_transform(weight, m))))
    return builder.emit_te(output_transform, products, m, (n, out_h, out_w), tiles,
                           primfunc_name_hint="winograd_output", primfunc_attrs={"op_pattern": OUT_ELEMWISE_FUSABLE})


def _combination(coefficients: np.ndarray, terms: list[Any]) -> Any:
    """``sum(c * t)`` as an expression, the zero terms left out and the
    coefficients of 1 and -1 as additions and subtractions."""
    from tvm import tirx

    total = None
    for c, term in zip(coefficients.tolist(), terms):
        if c == 0:
            continue
        if abs(c) != 1:
            term = term * tirx.const(abs(c), "float32")
        if total is None:
            total = term if c > 0 else -term
        else:
            total = total + term if c > 0 else total - term
    return total


def _choose(index: Any, values: list[Any]) -> Any:
    """``values[index]``: a chain of selects, which fold to the one value once
    the schedule unrolls the loop of ``index`` (``cpu_schedule.winograd``)."""
    from tvm import tirx

    chosen = values[-1]
    for i in range(len(values) - 2, -1, -1):
        chosen = tirx.Select(index == i, values[i], chosen)
    return chosen


def input_transform(data: Any, m: int, pad: int, tiles: tuple[int, int]) -> Any:
    """``B^T d B`` of each (m + 2) x (m + 2) tile ``d`` of the zero-padded
    NHWC ``data``, tiles m apart: V[(m + 2)^2, batch x tiles, channels], the
    A of the products. In two steps, ``B^T d`` first (rows of the tile
    combined, one row of ``B^T`` each), which the schedule computes for
    each row of ``B^T`` just before the row's part of V: one expression
    for every (m + 2)^2 elements would be 15 times larger, and compiling
    ResNet50 took 28 s longer so."""
    from tvm import te, tirx

    bt = MATRICES[m][0]
    alpha = m + 2
    n, h, w, c = (int(d) for d in data.shape)
    rows, cols = tiles
    zero = tirx.const(0.0, "float32")

    def rows_combined(a: Any, j: Any, p: Any, channel: Any) -> Any:
        image, ty, tx = p // (rows * cols), p // cols % rows, p % cols
        x = tx * m + j - pad
        column = []
        for i in range(alpha):
            y = ty * m + i - pad
            column.append(tirx.if_then_else(tirx.all(y >= 0, y < h, x >= 0, x < w), data[image, y, x, channel], zero))
        return _choose(a, [_combination(bt[r], column) for r in range(alpha)])

    bt_d = te.compute((alpha, alpha, n * rows * cols, c), rows_combined, name="winograd_input_rows",
                      attrs={TRANSFORM_KEY: "rows"})
    return te.compute((alpha * alpha, n * rows * cols, c),
                      lambda k, p, channel: _choose(k % alpha, [_combination(bt[b], [bt_d[k // alpha, j, p, channel]
                                                                                    for j in range(alpha)])
                                                                for b in range(alpha)]),
                      name="winograd_input", attrs={TRANSFORM_KEY: f"input{m}"})


def output_transform(products: Any, m: int, out_shape: tuple[int, int, int], tiles: tuple[int, int]) -> Any:
    """``A^T M A`` of each tile's products ``M``: the NHWC output, its last
    tiles cut where m does not divide it. In two steps, as ``input_transform``."""
    from tvm import te

    at = MATRICES[m][2]
    alpha = m + 2
    n, out_h, out_w = out_shape
    rows, cols = tiles

    def rows_combined(r: Any, b: Any, p: Any, channel: Any) -> Any:
        return _choose(r, [_combination(at[s], [products[a * alpha + b, p, channel] for a in range(alpha)])
                           for s in range(m)])

    at_m = te.compute((m, alpha, n * rows * cols, int(products.shape[2])), rows_combined, name="winograd_output_rows",
                      attrs={TRANSFORM_KEY: "rows"})

    def element(image: Any, y: Any, x: Any, channel: Any) -> Any:
        p = (image * rows + y // m) * cols + x // m
        return _choose(x % m, [_combination(at[s], [at_m[y % m, b, p, channel] for b in range(alpha)])
                               for s in range(m)])

    return te.compute((n, out_h, out_w, int(products.shape[2])), element, name="winograd_output",
                      attrs={TRANSFORM_KEY: f"output{m}"})
