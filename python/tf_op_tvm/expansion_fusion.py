"""An expansion convolution and the strided depthwise convolution after it as
one kernel (``fuse_expansions``), between FuseOps and FuseTIR.

MobileNet's and EfficientNet's blocks widen the channels with a 1x1
convolution, then run a depthwise convolution over the wide tensor. Where the
depthwise one has stride 2 early in the model, the wide tensor is megabytes
(112x112x96: 4.8 MB): the 1x1 kernel writes it past the caches and the
depthwise one reads it back. FuseOps keeps the two apart (each is a
reduction, the anchor of its own group). Here the two fused functions become
one, which FuseTIR makes one loop nest and ``cpu_schedule.expansion``
schedules in bands of output rows: each band's wide rows are computed into a
buffer that stays in L2, and read from there. Measured on a 2-core Cascade
Lake, in one process, turn about: the 112x112x16 -> 96 expansion and its 3x3
stride-2 depthwise convolution 1.36-1.43 times as fast as the two kernels,
56x56x24 -> 144 1.23-1.33, with the same outputs to the bit. Where the
depthwise convolution has stride 1, its bands recompute two wide rows in
every band (56x56x144: 1.03-1.06), and a wide tensor that fits in L2 gains
nothing from staying there (28x28x192: 0.66): those pairs stay apart.

A pair is merged only where the schedule takes the merged loop nest: one it
refused would run as the fallback's, slower than the two apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fuse_expansions(target: Any, rule: Any, report: Callable[[str], None]) -> Any:
    """The pass: each pair of fused functions, the first's result used by the
    second alone, whose merged loop nest ``rule`` (``cpu_schedule.expansion``'s
    for ``target``) schedules, called as one; ``report`` says how many."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.FuseExpansions")
    def fuse(mod: Any, _ctx: Any) -> Any:
        before = len(mod.functions)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
                mod = _fuse_in(mod, gvar, rule, target)
        if merged := len(mod.functions) - before:
            report(f"fused {merged} expansion convolutions into the stride-2 depthwise convolutions after them")
        return mod

    return fuse


def _fuse_in(mod: Any, gvar: Any, rule: Any, target: Any) -> Any:
    """``mod`` with the pairs in the Relax function ``gvar`` merged."""
    from tvm import relax

    func = mod[gvar]
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return mod
    uses = _use_counts(func)
    blocks, changed = [], False
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        producers = {b.var: b for b in block.bindings if _primitive_call(mod, b.value) is not None}
        merged, dropped = {}, set()
        for binding in block.bindings:
            second = _primitive_call(mod, binding.value)
            if second is None or not binding.value.args:
                continue
            first = producers.get(binding.value.args[0])
            if first is None or uses.get(first.var, 0) != 1 or first.var in dropped or first.var in merged:
                continue  # not a fused function's result used once, or one merged already
            pair = _merged_function(mod, first.value.op, second, target, rule)
            if pair is None:
                continue
            name = f"{first.value.op.name_hint}_{second.name_hint.removeprefix('fused_')}"
            builder = relax.BlockBuilder(mod)
            new_gvar = builder.add_func(pair, name)
            mod = builder.get()
            merged[binding.var] = relax.VarBinding(
                binding.var, relax.Call(new_gvar, [*first.value.args, *binding.value.args[1:]]))
            dropped.add(first.var)
        if merged:
            changed = True
            block = relax.DataflowBlock([merged.get(b.var, b) for b in block.bindings if b.var not in dropped])
        blocks.append(block)
    if changed:
        mod[gvar] = relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty,
                                   func.is_pure, func.attrs)
    return mod


def _use_counts(func: Any) -> dict[Any, int]:
    """How often each variable of ``func`` is used."""
    from tvm import relax

    counts: dict[Any, int] = {}

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _primitive_call(mod: Any, value: Any) -> Any:
    """The GlobalVar of the fused (Primitive) function ``value`` calls, or None."""
    from tvm import relax

    if not isinstance(value, relax.Call) or not isinstance(value.op, relax.GlobalVar):
        return None
    callee = mod[value.op]
    if isinstance(callee, relax.Function) and callee.attrs and callee.attrs.get("Primitive"):
        return value.op
    return None


def _merged_function(mod: Any, first: Any, second: Any, target: Any, rule: Any) -> Any:
    """One Primitive function computing ``second(first(...), ...)``, where
    FuseTIR makes of it a loop nest ``rule`` schedules; else None."""
    import tvm
    from tvm import relax
    from tvm.relax.utils import copy_with_new_vars

    f1, f2 = copy_with_new_vars(mod[first]), copy_with_new_vars(mod[second])
    if not f2.params or len(f1.body.blocks) != 1 or len(f2.body.blocks) != 1:
        return None
    # The second's first parameter bound to what the first returns: its bindings, then the second's.
    f2 = f2.bind_params({f2.params[0]: f1.body.body})
    block = relax.DataflowBlock([*f1.body.blocks[0].bindings, *f2.body.blocks[0].bindings])
    merged = relax.Function([*f1.params, *f2.params], relax.SeqExpr([block], f2.body.body),
                            f2.ret_ty).with_attr("Primitive", True)
    # What FuseTIR makes of it, and whether the rule schedules that.
    builder = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions.items()
                                               if isinstance(f, tvm.tirx.PrimFunc)}))
    callee = builder.add_func(merged, "merged")
    caller_params = [relax.Var(p.name, p.ty) for p in merged.params]
    with builder.function("main", caller_params):
        builder.emit_func_output(builder.emit(relax.Call(callee, caller_params)))
    trial = relax.transform.FuseTIR()(builder.get())
    prims = [f for gv, f in trial.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint == "merged"]
    if len(prims) != 1 or rule.apply(prims[0], target, False) is None:
        return None
    return merged
