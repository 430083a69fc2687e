"""The fallback schedule: what every loop nest that no rule of this package
took runs as (``compile_model.cpu_pipeline`` applies it after the rules), and
what rules use for the small loop nests around their main one.

Unscheduled, TVM runs the loop nests TOPI wrote, which put the reductions
innermost: a convolution's innermost loop runs over 3 input channels, a dense
layer's reads its weights a row apart for each step. With the output's last
dimension innermost instead (the channel, contiguous in the output, in NHWC
inputs and in the weights), LLVM vectorizes it, with the same sums in the same
order."""

from __future__ import annotations

import math
from typing import Any

from tvm import s_tir, tirx

from .lanes import PARALLEL_MIN_WORK

#: Runs of channels ``parallel_channel_chunks`` makes: 2, 4 or 8 threads share
#: them evenly.
CHANNEL_CHUNKS = 8


def schedule_blocks(sch: Any) -> tuple[int, int]:
    """Schedules each block of ``sch``'s function: a reduction by
    ``channel_innermost``, any other by ``parallel_elementwise``. Returns how
    many blocks reduce, and how many of them ``channel_innermost`` took."""
    reductions = scheduled = 0
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if any(int(v.iter_type) == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars):
            reductions += 1
            scheduled += channel_innermost(sch, block)
        else:
            parallel_elementwise(sch, block)
    return reductions, scheduled


def channel_innermost(sch: Any, block: Any) -> bool:
    """Moves the loop over ``block``'s output's last dimension inside its
    reduction loops, where every input that it indexes, it indexes in the last
    dimension too, or in one followed by dimensions of 1 (NHWC convolutions,
    depthwise too, and pooling, matmul against a (K, N) weight, channel-wise
    means); False for any other block, which it leaves as it was. Each output
    element's sum runs in the same order as before, so the results are the same."""
    stmt = sch.get(block)
    kinds = [int(v.iter_type) for v in stmt.iter_vars]
    if set(kinds) != {tirx.IterVar.DataPar, tirx.IterVar.CommReduce} or len(stmt.writes) != 1:
        return False
    loops = sch.get_loops(block)[-len(kinds):]
    realize = sch.get(loops[-1]).body if len(loops) == len(kinds) else None
    if (not isinstance(realize, s_tir.SBlockRealize)
            or not all(value.same_as(sch.get(loop).loop_var) for value, loop in zip(realize.iter_values, loops))):
        return False  # not one loop per block variable, in order: TOPI's plain nests are
    channel = next((i for i, v in enumerate(stmt.iter_vars) if kinds[i] == tirx.IterVar.DataPar
                    and v.var.same_as(stmt.writes[0].region[-1].min)), None)
    reductions = [i for i, kind in enumerate(kinds) if kind == tirx.IterVar.CommReduce]
    if channel is None or channel > reductions[-1]:
        return False
    var = stmt.iter_vars[channel].var
    for read in stmt.reads:  # the channel's stride in each input it indexes must be 1
        dims = [d for d, r in enumerate(read.region)
                if any(v.same_as(var) for v in tirx.analysis.undefined_vars(r.min))]
        shape = list(getattr(read.source, "shape", None) or [])  # source: the read buffer
        if len(dims) > 1 or (dims and (len(shape) != len(read.region) or any(
                not isinstance(n, tirx.IntImm) or int(n) != 1 for n in shape[dims[0] + 1:]))):
            return False
    try:
        others = [loop for i, loop in enumerate(loops) if i != channel]
        sch.reorder(*others, loops[channel])
        # The output's other dimensions, now outermost, spread over TVM's threads
        # (before decompose_reduction, which puts the init block under them).
        if not parallel_outer(sch, [loop for i, loop in enumerate(loops[:reductions[0]]) if i != channel], loops):
            parallel_channel_chunks(sch, loops[channel], others, loops)
        sch.decompose_reduction(block, loops[reductions[0]])
    except s_tir.ScheduleError:  # a failed primitive changes nothing; what succeeded before it is correct
        return False
    return True


def parallel_outer(sch: Any, outer: list[Any], nest: list[Any]) -> bool:
    """Fuses the loops ``outer`` (adjacent, outermost of the loop nest ``nest``,
    each a data-parallel dimension) into one that runs on TVM's threads
    (``TVM_NUM_THREADS``), when ``nest`` does enough work for it to pay; whether
    it did (the caller counts parallel loops in the schedule)."""
    if not _worth_threads(sch, nest) or all(int(sch.get(loop).extent) == 1 for loop in outer):
        return False
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True


def parallel_channel_chunks(sch: Any, channel: Any, others: list[Any], nest: list[Any]) -> None:
    """Splits the loop ``channel`` (innermost of ``nest``, inside ``others``)
    into ``CHANNEL_CHUNKS`` runs of channels, or fewer where they do not divide
    it, and runs the runs on TVM's threads, outermost: for a loop nest with
    enough work but no other output dimension to share out (a classifier's
    product at batch 1, 1280 by 1000 weights that one thread read at 42 GB/s)."""
    width = sch.get(channel).extent
    if not _worth_threads(sch, nest) or not isinstance(width, tirx.IntImm):
        return
    chunks = next((d for d in range(CHANNEL_CHUNKS, 1, -1) if int(width) % d == 0), None)
    if chunks is None:
        return
    run, _ = sch.split(channel, [chunks, None])
    sch.reorder(run, *others)
    sch.parallel(run)


def _worth_threads(sch: Any, nest: list[Any]) -> bool:
    extents = [sch.get(loop).extent for loop in nest]
    return (bool(nest) and all(isinstance(n, tirx.IntImm) for n in extents)
            and math.prod(int(n) for n in extents) >= PARALLEL_MIN_WORK)


def parallel_elementwise(sch: Any, block: Any) -> None:
    """All but the innermost loop of an elementwise ``block`` (no reduction, one
    loop per block variable) on TVM's threads, the innermost left to LLVM's
    vectorizer; any other block is left as it was."""
    stmt = sch.get(block)
    if any(int(v.iter_type) != tirx.IterVar.DataPar for v in stmt.iter_vars) or len(stmt.iter_vars) < 2:
        return
    loops = sch.get_loops(block)
    if len(loops) != len(stmt.iter_vars):
        return
    try:
        parallel_outer(sch, loops[:-1], loops)
    except s_tir.ScheduleError:  # e.g. a loop whose variable also indexes a reduction elsewhere
        pass
