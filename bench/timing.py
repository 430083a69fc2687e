"""Interleaved timing: contenders measured in turns, in one process, so that the
machine's drift (other load, frequency, cache state) hits each of them alike.

Every round times each contender once (``number`` calls, seconds per call), the
order reversed on every other round (A B, B A, A B, ...), and a comparison is the
median over rounds of the ratio of two contenders' times in the same round.

A contender is a callable timed here with ``time.perf_counter``, or a
``SelfTimed`` one that makes its calls and times them itself (a C loop), so
that its figure holds no Python per call.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Timings:
    """Seconds per call of each contender, one entry per round."""

    per_call: dict[str, list[float]] = field(default_factory=dict)
    number: dict[str, int] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """The median over rounds of ``name``'s seconds per call."""
        return statistics.median(self.per_call[name])

    def ratios(self, numerator: str, denominator: str) -> list[float]:
        """``numerator / denominator`` in each round."""
        return [a / b for a, b in zip(self.per_call[numerator], self.per_call[denominator], strict=True)]

    def ratio(self, numerator: str, denominator: str) -> float:
        """The median of the per-round ratios ``numerator / denominator``."""
        return statistics.median(self.ratios(numerator, denominator))

    def ratio_spread(self, numerator: str, denominator: str) -> tuple[float, float]:
        """The first and third quartiles of the per-round ratios."""
        return quartiles(self.ratios(numerator, denominator))


@dataclass(frozen=True)
class SelfTimed:
    """A contender that times itself: ``time(number)`` makes ``number`` calls and
    returns the seconds per call it measured where the calls are made."""

    time: Callable[[int], float]

    def __call__(self) -> object:
        return self.time(1)


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(25th, 75th) percentiles; the single value twice for one value."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def _run(fn: Callable[[], object], number: int) -> float:
    """Seconds per call over ``number`` calls of ``fn`` (as ``fn`` measures them,
    for a ``SelfTimed`` one)."""
    if isinstance(fn, SelfTimed):
        return fn.time(number)
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def calibrate(fn: Callable[[], object], min_time: float, max_number: int = 1_000_000) -> int:
    """How many calls of ``fn`` one timing needs to last at least ``min_time`` s."""
    number = 1
    while number < max_number:
        elapsed = _run(fn, number) * number
        if elapsed >= min_time:
            return number
        # Aim a little past the target; at least double to converge quickly.
        guess = int(number * min_time * 1.2 / max(elapsed, 1e-9))
        number = min(max_number, max(number * 2, guess))
    return max_number


def interleave(
    contenders: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    min_time: float,
    warmup: int = 3,
) -> Timings:
    """Times every contender in each of ``rounds`` rounds, in alternating order.

    Each contender is first called ``warmup`` times (tracing, allocator and cache
    warm-up), then calibrated so that one timing lasts about ``min_time`` seconds.
    The garbage collector is off while timing, as in ``timeit``.
    """
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    result = Timings(number={name: calibrate(contenders[name], min_time) for name in names})
    result.per_call = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                result.per_call[name].append(_run(contenders[name], result.number[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return result
