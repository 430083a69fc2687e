"""Interleaved timing: contenders timed in turns in one process, so that the machine's drift
(load, frequency, caches) hits each alike. Every round times each contender once, the order
reversed every other round (A B, B A, ...); a comparison is the median over rounds of the ratio of
two contenders' times in a round, or of single calls' low percentiles. ``SelfTimed``: a C loop."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


def quartiles(values: Sequence[float]) -> tuple[float, float]:  # the single value twice for one value
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@dataclass
class Timings:
    per_call: dict[str, list[float]]  # seconds per call of each contender, one entry per round

    def median(self, name: str) -> float:
        return statistics.median(self.per_call[name])

    def ratios(self, numerator: str, denominator: str) -> list[float]:
        """``numerator / denominator`` in each round (a comparison is their median)."""
        return [a / b for a, b in zip(self.per_call[numerator], self.per_call[denominator], strict=True)]

    def ratio(self, numerator: str, denominator: str) -> float:
        return statistics.median(self.ratios(numerator, denominator))

    def percentile(self, name: str, q: int) -> float:
        return statistics.quantiles(self.per_call[name], n=100)[q - 1]


@dataclass(frozen=True)
class SelfTimed:
    """A contender whose ``time(number)`` makes ``number`` calls and returns the seconds per call it measured."""

    time: Callable[[int], float]

    def __call__(self) -> object:
        return self.time(1)


def _run(fn: Callable[[], object], number: int) -> float:  # seconds per call over number calls
    if isinstance(fn, SelfTimed):
        return fn.time(number)
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def calibrate(fn: Callable[[], object], min_time: float, max_number: int = 1_000_000) -> int:
    """How many calls of ``fn`` one timing needs to last at least ``min_time`` s."""
    number = 1
    while number < max_number and (elapsed := _run(fn, number) * number) < min_time:
        # Aim a little past the target; at least double to converge quickly.
        number = min(max_number, max(number * 2, int(number * min_time * 1.2 / max(elapsed, 1e-9))))
    return number


def interleave(contenders: Mapping[str, Callable[[], object]], *, rounds: int, min_time: float = 0.0,
               single: int = 0, warmup: int = 3) -> Timings:
    """Times every contender in each of ``rounds`` rounds, in alternating order, after
    ``warmup`` calls each (tracing, allocator, caches) and a calibration to about
    ``min_time`` s per timing; the garbage collector is off, as in timeit. ``single``:
    that many single calls a round instead, each call's time kept for a percentile."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    number = {name: calibrate(contenders[name], min_time) for name in names if not single}
    result = Timings({name: [] for name in names})
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                fn, times = contenders[name], result.per_call[name]
                if single:
                    times.extend(_run(fn, 1) for _ in range(single))
                else:
                    times.append(_run(fn, number[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return result
