"""What every default CPU schedule rule shares: the functions it is offered,
that a refusal leaves the function to the fallback schedule, and which
buffers are the model's constants."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule


class Rule(CPUScheduleRule):
    """A rule for llvm targets: ``schedule`` takes a PrimFunc's schedule and
    returns it scheduled, or None for a function it does not recognise. A
    primitive that refuses (a nest the rule misread) leaves the function
    unscheduled, as None does: ``fallback.channel_innermost`` takes it."""

    def apply(self, func: Any, target: Any, _tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self.schedule(s_tir.Schedule(func), target)
        except s_tir.ScheduleError:
            return None

    def schedule(self, sch: Any, target: Any) -> Any:
        raise NotImplementedError


def plain_loops(sch: Any, block: Any) -> list[Any] | None:
    """``block``'s loops where there is one for each of its variables, in
    order, each binding its variable (the loop nests TOPI and TE write); None
    for any other nest."""
    loops = sch.get_loops(block)
    if len(loops) != len(sch.get(block).iter_vars):
        return None
    realize = sch.get(loops[-1]).body
    if (not isinstance(realize, s_tir.SBlockRealize)
            or not all(value.same_as(sch.get(loop).loop_var) for value, loop in zip(realize.iter_values, loops))):
        return None
    return loops


def has_reduction(block: Any) -> bool:
    """Whether a block (its statement) reduces over some variable."""
    return any(int(v.iter_type) == tirx.IterVar.CommReduce for v in block.iter_vars)


def is_constant(sch: Any, buffer: Any) -> bool:
    """Whether ``buffer`` is a parameter of the function for which its callers
    pass a constant (a weight of the model, not an input): those that
    relax.transform.AttachAttrLayoutFreeBuffers lists in the function's
    ``layout_free_buffers``. A schedule may repack such a buffer once, at
    compile time: compile_model.cpu_pipeline runs the blocks it marks
    ``meta_schedule.layout_rewrite_preproc`` there."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs else None
    return any(buffer.same_as(func.params[int(i)]) for i in free or ())
