"""Default CPU schedules for an untuned compile: dlight rules, tried in order on
each of the model's loop nests (PrimFuncs) by ``ApplyDefaultSchedule``; the
first rule that recognises a function schedules it. A function no rule takes
keeps the fallback schedule, ``fallback.channel_innermost``.

Each module holds the rules for one family of loop nests; ``lanes`` says how
wide the target's vectors are."""

from __future__ import annotations

from typing import Any

from tvm import s_tir

from . import conv, elementwise, expansion, fallback, matmul, pool, reduction, winograd


def rules(target: Any) -> list[Any]:
    """The rules for an llvm ``target``, most specific first."""
    return [*winograd.rules(target), expansion.ExpansionDepthwise.for_target(target), *conv.rules(target), *pool.rules(target),
            *matmul.rules(target), *reduction.rules(target), *elementwise.rules(target)]


def default_schedule(func: Any, target: Any) -> Any:
    """The schedule of the PrimFunc ``func`` in an untuned compile for
    ``target``: the first rule's that takes it, else the fallback's."""
    for rule in rules(target):
        sch = rule.apply(func, target, False)
        if sch is not None:
            return sch
    sch = s_tir.Schedule(func)
    fallback.schedule_blocks(sch)
    return sch
