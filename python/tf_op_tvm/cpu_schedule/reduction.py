"""Schedules for row reductions: softmax, and the means and variances of layer
normalization, with the elementwise work fused around them.

These functions reduce each row of their input (the last axis) to one value,
and work elementwise on the rows between reductions (softmax: max, exp, sum,
divide). Unscheduled, each block is a loop nest over the whole input, writing
intermediates as big as the input that the next block reads back; and each
row's sum is one chain of dependent additions, one add's latency per element.

The rule (like TVM's ``dlight.cpu.Reduction``, which runs softmax slower than
the fallback here: 0.40 against 0.14 ms at batch 8) takes ``ROWS`` rows at a
time and computes every block for them before the next rows, so that the
intermediates are a few rows and stay in L1; the elementwise blocks run along
the row in vectors. A reduction over a row of whole vectors runs along it in
vectors (a vector of partial sums, or maxima, per row), then across the last
vector's lanes; the ``ROWS`` rows' reductions are independent chains that the
CPU runs side by side. A max is the same in any order; a sum in vectors adds
in another order than the untuned loop nest, a rounding apart (within 1e-4 of
TF, the goal of every default schedule): softmax at batch 8 on AVX-512 went
from 0.12 to 0.10 ms with the max in vectors, the transformer block's layer
norms' means from 54 to 7 µs and softmax to 0.06 ms with the sums too.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import s_tir, tirx

from .lanes import PARALLEL_MIN_WORK, vector_lanes
from .rule import Rule, has_reduction

#: Rows reduced side by side: enough independent additions to cover an add's
#: latency (4 cycles) on two ports.
ROWS = 8

#: TVM (0.27) puts a buffer allocated in a task on the stack below this many
#: bytes (``kMaxStackAlloca``), else it allocates it per task from the heap.
STACK_BYTES = 1024

#: The least work for which a row reduction whose buffers fit on the stack runs
#: on TVM's threads: softmax at batch 8 (131072 elements) went from 44 to 25 µs.
PARALLEL_ROWS_MIN_WORK = 1 << 15


def rules(target: Any) -> list[Any]:
    return [RowReduction()]


class RowReduction(Rule):
    """Functions whose reductions all run over the innermost axis of rows that
    every block shares."""

    def schedule(self, sch: Any, target: Any) -> Any:
        return schedule_rows(sch, target)


def _leading_spatial(sch: Any, block: Any) -> int:
    kinds = [int(v.iter_type) for v in sch.get(block).iter_vars]
    return next((i for i, kind in enumerate(kinds) if kind != tirx.IterVar.DataPar), len(kinds))


def _row_axes(sch: Any, block: Any) -> int:
    """A reduction's row axes: its leading data-parallel ones but those of
    extent 1 just before the reduction, where a mean that keeps its
    dimensions has the row's (a layer norm's (1, 64, 1) of (1, 64, 128))."""
    rows = _leading_spatial(sch, block)
    domains = sch.get(block).iter_vars
    while rows > 0 and isinstance(domains[rows - 1].dom.extent, tirx.IntImm) and int(domains[rows - 1].dom.extent) == 1:
        rows -= 1
    return rows


def _inline_single_uses(sch: Any, blocks: list[Any]) -> list[Any]:
    """Computes each elementwise block but the last where its one consumer
    reads it: a layer norm's ``x - mean``, its square, its scale's steps, are
    expressions in the blocks that use them instead of rows kept in buffers.
    A block read by two (softmax's exponentials, read by the sum and the
    division) stays, computed once. The blocks left, in order."""
    for block in blocks[:-1]:
        if not has_reduction(sch.get(block)) and len(sch.get_consumers(block)) == 1:
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                pass  # not inlinable (its consumer reads it at other indices): it stays a block
    return sch.get_child_blocks(sch.get_sblock("root"))


def schedule_rows(sch: Any, target: Any) -> Any:
    """``sch`` scheduled ``ROWS`` rows at a time, or None when it is not a row
    reduction: no reduction, one that is not over the last axis alone, a last
    block that reduces, blocks whose loops are not one per block variable, or
    blocks that do not share their leading (row) axes."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if has_reduction(sch.get(b))]
    if not reductions or has_reduction(sch.get(blocks[-1])):
        return None
    for block in blocks:
        stmt, loops = sch.get(block), sch.get_loops(block)
        if len(loops) != len(stmt.iter_vars) or any(
                not isinstance(sch.get(loop).extent, tirx.IntImm) for loop in loops):
            return None
    for block in reductions:
        if _leading_spatial(sch, block) != len(sch.get(block).iter_vars) - 1:
            return None  # a reduction over more than the last axis, or not last
        if not _reads_along_rows(sch.get(block)):
            return None  # a matrix product that the Matmul rule left (a classifier's 1000 columns)
    rows = min(_row_axes(sch, b) for b in reductions)
    last = blocks[-1]
    loops = sch.get_loops(last)
    if rows == 0 or len(loops) < rows:  # a reduction of everything to one value has no rows
        return None
    # The rows must be the same in every block: the reductions' leading extents
    # are the last block's.
    row_extents = [int(sch.get(loop).extent) for loop in loops[:rows]]
    for block in reductions:
        if [int(sch.get(loop).extent) for loop in sch.get_loops(block)[:rows]] != row_extents:
            return None
    lanes = vector_lanes(target)
    blocks = _inline_single_uses(sch, blocks)
    reductions = [b for b in blocks if has_reduction(sch.get(b))]
    in_vectors = _in_vectors(sch, reductions, lanes)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    # The rows taken side by side: a part of the innermost row axis that is
    # not 1 (a mean keeps a last axis of 1). That axis alone is split, so that
    # each block's indices stay affine in the loops, as decompose_reduction needs.
    axis = max((i for i, n in enumerate(row_extents) if n > 1), default=rows - 1)
    work = math.prod(int(sch.get(loop).extent) for loop in loops)
    # A row's elementwise results (softmax's exponentials) are kept for the
    # rows side by side, in a buffer under the loop over them. Run on TVM's
    # threads, that buffer is allocated by each task: on its stack under
    # STACK_BYTES, else through TVMBackendAllocWorkspace. So a reduction with
    # work enough for two threads takes fewer rows side by side where that puts
    # the buffer on the stack, and runs in parallel.
    row_bytes = 4 * math.prod(int(sch.get(loop).extent) for loop in loops[rows:]) if any(
        not has_reduction(sch.get(b)) for b in blocks[:-1]) else 0
    fit = [d for d in range(1, ROWS + 1) if row_extents[axis] % d == 0 and d * row_bytes < STACK_BYTES]
    if work >= PARALLEL_MIN_WORK and not fit:
        return None  # too much for one thread, rows too long for the stack: the fallback's
    parallel = work >= PARALLEL_ROWS_MIN_WORK and bool(fit)
    side_by_side = max(fit) if parallel else max(d for d in range(1, ROWS + 1) if row_extents[axis] % d == 0)
    outer, _ = sch.split(loops[axis], [None, side_by_side])
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, outer, preserve_unit_loops=True)
    shared = axis + 1  # the loops every block is under: the rows' and the groups of side_by_side
    if parallel:
        # before decompose_reduction, to which a reduction without its init
        # seems to carry a dependence between iterations
        rows_loops = sch.get_loops(last)[:shared]
        sch.parallel(sch.fuse(*rows_loops) if len(rows_loops) > 1 else rows_loops[0])
        shared = 1
    for block in blocks:
        inner = sch.get_loops(block)[shared:]
        if sch.get(block).name_hint in in_vectors:
            *_, across, along = inner  # the vector's lanes, then the steps along the row
            sch.reorder(along, across)
            sch.vectorize(across)
            sch.decompose_reduction(block, along)
        elif has_reduction(sch.get(block)):
            _reduce_side_by_side(sch, block, inner)
        else:
            _vectorize_row(sch, inner, lanes)
    return sch


def _reads_along_rows(block: Any) -> bool:
    """Whether every buffer ``block`` reads with its reduction variable, it
    reads along its last axis: along rows. A matrix product's weight (K, N) is
    read down its columns instead, a row of it apart for each step, where the
    fallback (the column innermost, in vectors) reads it in order (a 2048 x
    1000 dense layer at batch 1: 1.04 against 0.61 ms)."""
    k = block.iter_vars[-1].var
    for read in block.reads:
        uses = [any(v.same_as(k) for v in tirx.analysis.undefined_vars(r.min)) for r in read.region]
        if any(uses[:-1]):
            return False
    return True


def _in_vectors(sch: Any, reductions: list[Any], lanes: int) -> set[str]:
    """Splits each sum, max or min over a row of whole vectors into one of
    vectors along the row (rfactor: a block whose lanes are data parallel,
    which runs in vectors) and one across the last vector's lanes; the names
    of the vector blocks."""
    in_vectors = set()
    for block in reductions:
        stmt = sch.get(block)
        store = stmt.body
        row = sch.get_loops(block)[-1]
        extent = int(sch.get(row).extent)
        if (not isinstance(store, tirx.BufferStore) or not isinstance(store.value, (tirx.Max, tirx.Min, tirx.Add))
                or extent % lanes or extent <= lanes):
            continue
        _, across = sch.split(row, [None, lanes])
        vectors = sch.rfactor(across, len(stmt.iter_vars) - 1)
        # rfactor puts the lanes first among the block's variables: rows first
        # again, then the lanes, then the steps along the row (the reduction).
        count = len(sch.get(vectors).iter_vars)
        sch.reorder_block_iter_var(vectors, [*range(1, count - 1), 0, count - 1])
        count = len(sch.get(block).iter_vars)
        sch.reorder_block_iter_var(block, [*range(1, count), 0])
        in_vectors.add(sch.get(vectors).name_hint)
    return in_vectors


def _reduce_side_by_side(sch: Any, block: Any, loops: list[Any]) -> None:
    """The reduction loop (last) outside the rows' loops, which are unrolled:
    each step of it adds one element to every row's sum."""
    *row_loops, k = loops
    if row_loops:
        sch.reorder(k, *row_loops)
        row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
        sch.unroll(row)
    sch.decompose_reduction(block, k)


def _vectorize_row(sch: Any, loops: list[Any], lanes: int) -> None:
    """The innermost loop in vectors, when it runs along a row (one of at
    least ``lanes`` elements, whole vectors or under two)."""
    if not loops:
        return
    inner = loops[-1]
    extent = int(sch.get(inner).extent)
    if extent % lanes == 0:
        sch.vectorize(sch.split(inner, [None, lanes])[1] if extent > 2 * lanes else inner)
    elif lanes // 2 <= extent < 2 * lanes:
        sch.vectorize(inner)
