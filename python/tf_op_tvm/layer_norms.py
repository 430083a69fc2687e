"""Each layer normalization as one kernel: ``fuse_layer_norms``, a Relax pass
before legalization.

TFLite's converter spells Keras's LayerNormalization out in a dozen ops: the
row's mean, the mean of the squared differences from it, ``rsqrt`` of that
plus epsilon, then ``x * s - mean * s`` (``s`` the rsqrt times gamma, where
the layer scales) plus beta (where it centres). TVM's FuseOps cuts that
chain at each reduction, since it fuses no reduction into the work after it:
four kernels, each a pass over the rows, and the intermediates (the squared
differences, as big as the input) written and read back. Grouped here into
one function, which FuseTIR makes one kernel, the row-reduction rule
(``cpu_schedule.reduction``) computes the whole normalization a few rows at a
time, the rows in L1: on a 2-core Zen 4 (TVM's VM, one process, turn about),
a layer norm of 64 x 128 alone 4.0 -> 2.8 µs, the transformer block 1.02x at
batch 1 and 1.03-1.045x at batch 8 (its two layer norms 10 -> 5 µs a call at
batch 1). The same operations in the same order: values move by the reductions'
rounding only (within 4e-7 of the largest output, measured).

A square written ``power(x, 2.0)`` becomes ``x * x`` first (the same value to
the bit: LLVM makes the one of the other when the exponent is a constant in
the code, which a grouped function's constants, passed in as arguments, are
not).
"""

from __future__ import annotations

from typing import Any


def fuse_layer_norms() -> Any:
    """The pass: squares as products, then each layer normalization over the
    last axis grouped into a function of its own."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.FuseLayerNorms")
    def fuse(mod: Any, _ctx: Any) -> Any:
        return relax.transform.FuseOpsByPattern(_patterns(), bind_constants=False)(_squares()(mod))

    return fuse


def _squares() -> Any:
    """``power(x, 2.0)`` as ``multiply(x, x)``, in every function."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    base, exponent = wildcard(), is_const()
    square = is_op("relax.power")(base, exponent)

    def rewrite(call: Any, matched: dict[Any, Any]) -> Any:
        # A scalar exponent only: one of another shape broadcasts x (and a
        # tensor of exponents may hold others than 2).
        value = matched[exponent].value
        value = value.numpy() if hasattr(value, "numpy") else value
        two = getattr(value, "shape", ()) == () and float(value) == 2.0
        return relax.op.multiply(matched[base], matched[base]) if two else call

    @relax.transform.function_pass(opt_level=0, name="tvmdsoop.Squares")
    def squares(func: Any, _mod: Any, _ctx: Any) -> Any:
        return rewrite_call(square, rewrite, func)

    return squares


def _patterns() -> list[Any]:
    """TFLite's layer normalization, as its converter writes it (TF 2.18-2.21):
    scaled (``s = rsqrt(...) * gamma``) or not (``s = rsqrt(...)``), centred
    (``+ beta``) or not. Each checked to reduce the last axis, keeping it."""
    from tvm.relax.dpl import is_const, is_op, wildcard
    from tvm.relax.transform import FusionPattern

    x, gamma, beta = wildcard(), wildcard(), wildcard()
    mean = is_op("relax.mean")(x)
    centred = is_op("relax.subtract")(x, mean)
    variance = is_op("relax.mean")(is_op("relax.multiply")(centred, centred))
    rstd = is_op("relax.rsqrt")(is_op("relax.add")(variance, is_const()))
    patterns = []
    for scale in (is_op("relax.multiply")(rstd, gamma), rstd):
        shift = is_op("relax.multiply")(is_op("relax.negative")(mean), scale)
        scaled = is_op("relax.multiply")(x, scale)
        for out in (is_op("relax.add")(scaled, is_op("relax.add")(shift, beta)), is_op("relax.add")(scaled, shift)):
            patterns.append(FusionPattern("tvmdsoop.layer_norm", out, {"mean": mean, "variance": variance},
                                          _over_last_axis))
    return patterns


def _over_last_axis(context: Any) -> bool:
    """Whether both means reduce the last axis alone and keep it: the rows
    the row-reduction rule schedules (another axis would leave the group to
    the fallback schedule, slower than the four kernels it replaces)."""
    for name in ("mean", "variance"):
        call = context.annotated_expr[name]
        axes, rank = call.attrs.axis, call.args[0].ty.ndim
        if not call.attrs.keepdims or axes is None or len(axes) != 1 or int(axes[0]) % rank != rank - 1:
            return False
    return True
