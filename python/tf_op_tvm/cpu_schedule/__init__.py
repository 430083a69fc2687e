"""Default CPU schedules for an untuned compile: dlight rules, tried in order on
each of the model's loop nests (PrimFuncs) by ``ApplyDefaultSchedule``; the
first rule that recognises a function schedules it. A function no rule takes
keeps the fallback schedule, ``fallback.channel_innermost``.

Each module holds the rules for one family of loop nests; ``lanes`` says how
wide the target's vectors are."""

from __future__ import annotations

from typing import Any

from . import conv, elementwise, matmul, pool, reduction


def rules(target: Any) -> list[Any]:
    """The rules for an llvm ``target``, most specific first."""
    return [*conv.rules(target), *pool.rules(target), *matmul.rules(target), *reduction.rules(target),
            *elementwise.rules(target)]
