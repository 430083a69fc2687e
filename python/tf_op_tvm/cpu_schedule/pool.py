"""Schedules for NHWC pooling: max and average pooling over a window of rows
and columns, with the padding before it and the elementwise work after it.

TOPI writes a 2-D pool as one reduction block over (n, h, w, c, ry, rx),
after a ``pad_temp`` block when it pads, and before the division of an
average pool (and whatever FuseOps puts behind it). Left to the fallback
(``channel_innermost``: the channel inside the window's loops), LLVM's loop
vectorizer vectorizes the loop over output pixels instead of the channel,
with a gather for every input and a scatter for every output: 170 µs for the
2x2 max pool of the Keras CNN's 32x32x8 feature maps at batch 32, a pass over
1 MiB. Here the channel runs in whole vectors (contiguous in the NHWC input
and output), inside the window's loops, so that each step of the window loads
one vector per output vector and no gather is left to LLVM; rows of the
output go to TVM's threads. The padding test is inlined into the reduction;
an epilogue runs on each output row as it is finished, from a row's buffer.
Each output's window is reduced in the same order as in TOPI's nest, so the
results are the same to the bit.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

from .lanes import PARALLEL_MIN_WORK, vector_lanes
from .rule import Rule, has_reduction, plain_loops

#: The narrowest vector worth the rule: with fewer channels per vector (an odd
#: channel count), the fallback does as well.
_MIN_LANES = 4


def rules(target: Any) -> list[Any]:
    """The pooling rules for an llvm ``target``."""
    return [PoolNHWC(vector_lanes(target))]


class PoolNHWC(Rule):
    """NHWC 2-D pooling, channels in vectors, padding and epilogue fused."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes

    def schedule(self, sch: Any, _target: Any) -> Any:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        reductions = [i for i, b in enumerate(blocks) if has_reduction(sch.get(b))]
        if len(reductions) != 1:
            return None
        at = reductions[0]
        pool = blocks[at]
        channels = _pool_channels(sch, pool)
        if channels is None:
            return None
        lanes = math.gcd(channels, self.lanes)  # a power of two: a register, or a part of one LLVM keeps whole
        if lanes < _MIN_LANES:
            return None
        producers, epilogue = blocks[:at], blocks[at + 1:]
        extents = [int(sch.get(loop).extent) for loop in sch.get_loops(pool)]

        for block in epilogue[:-1]:
            sch.compute_inline(block)
        for block in reversed(producers):  # pad_temp: its reads, with the padding test, go into the window
            sch.compute_inline(block)
        # Without an epilogue the window is reduced in the output itself: its
        # address does not change while the window runs, so LLVM keeps it in a
        # register. With one, a row of the output is reduced in a buffer of its
        # own that the epilogue then reads: the pool's output, a "global"
        # buffer that TVM compacts to the row and, under 1 KiB, puts on the
        # stack (TVM 0.27 allocates a "local" one of any size with a call).
        out = epilogue[-1] if epilogue else pool
        loops = sch.get_loops(out)
        if [int(sch.get(loop).extent) for loop in loops[:4]] != extents[:4] or len(loops) != (4 if epilogue else 6):
            return None  # an epilogue of another shape
        n, h, w, c = loops[:4]
        co, cv = sch.split(c, [None, lanes])
        if epilogue:
            sch.compute_at(pool, h, preserve_unit_loops=True)
            sch.vectorize(cv)  # the epilogue's lanes; below, the pool's own loops under h
            *_, w, c, ry, rx = sch.get_loops(pool)
            co, cv = sch.split(c, [None, lanes])
        *_, ry, rx = sch.get_loops(pool)
        sch.reorder(w, co, ry, rx, cv)  # the window inside each vector of channels
        # Loop kinds before decompose_reduction, which copies them to the init block.
        if math.prod(extents) >= PARALLEL_MIN_WORK:
            sch.parallel(sch.fuse(n, h))
        sch.vectorize(cv)
        sch.decompose_reduction(pool, ry)
        return sch


def _pool_channels(sch: Any, block: Any) -> int | None:
    """The channel count of the pool ``block`` computes, when it is TOPI's NHWC
    2-D pool: variables (n, h, w, c) spatial and two reductions, one loop each
    in that order, the output indexed [n, h, w, c], and one input, float32,
    indexed [n, ., ., c]; None otherwise."""
    stmt = sch.get(block)
    kinds = [int(v.iter_type) for v in stmt.iter_vars]
    if kinds != [tirx.IterVar.DataPar] * 4 + [tirx.IterVar.CommReduce] * 2 or len(stmt.writes) != 1:
        return None
    loops = plain_loops(sch, block)
    if loops is None:
        return None
    ivars = [v.var for v in stmt.iter_vars]
    output = stmt.writes[0]
    if len(output.region) != 4 or not all(r.min.same_as(v) for r, v in zip(output.region, ivars)):
        return None
    inputs = [r for r in stmt.reads if not r.source.same_as(output.source)]
    if len(inputs) != 1 or len(inputs[0].region) != 4:
        return None
    region = inputs[0].region
    if not (region[0].min.same_as(ivars[0]) and region[3].min.same_as(ivars[3])):
        return None
    if any(buffer.dtype != "float32" for buffer in (inputs[0].source, output.source)):
        return None
    channels = stmt.iter_vars[3].dom.extent
    return int(channels) if isinstance(channels, tirx.IntImm) else None
