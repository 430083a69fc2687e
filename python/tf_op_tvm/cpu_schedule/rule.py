"""What every default CPU schedule rule shares: the functions it is offered,
and that a refusal leaves the function to the fallback schedule."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule


class Rule(CPUScheduleRule):
    """A rule for llvm targets: ``schedule`` takes a PrimFunc's schedule and
    returns it scheduled, or None for a function it does not recognise. A
    primitive that refuses (a nest the rule misread) leaves the function
    unscheduled, as None does: ``compile_model.channel_innermost`` takes it."""

    def apply(self, func: Any, target: Any, _tunable: bool) -> Any:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self.schedule(s_tir.Schedule(func), target)
        except s_tir.ScheduleError:
            return None

    def schedule(self, sch: Any, target: Any) -> Any:
        raise NotImplementedError


def has_reduction(block: Any) -> bool:
    """Whether a block (its statement) reduces over some variable."""
    return any(int(v.iter_type) == tirx.IterVar.CommReduce for v in block.iter_vars)
