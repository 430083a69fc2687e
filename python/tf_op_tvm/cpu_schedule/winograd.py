"""Schedules for the input and output transforms of Winograd's convolutions
(tf_op_tvm/winograd.py; the matrix products between them are ``matmul``'s).

Each element of a transform is one of (m + 2)^2 (input) or m^2 (output) sums
of a tile's values, chosen by a chain of selects on its position in the
tile. The rule runs each tile (and a vector of channels) as one iteration:
the positions' loops unrolled, so that every select folds to its sum and the
tile's values, loaded once, serve all of them; the channels vectorized; the
tiles on TVM's threads. The output transform takes the convolution's
epilogue (bias, activation, residual add) that FuseOps put after it.
Unscheduled, the input transform of ResNet50's 56x56x64 layer, as Relax's
slices and adds, took 1770 µs; so, 62.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import s_tir

from .lanes import PARALLEL_MIN_WORK, vector_lanes
from .rule import Rule

#: The block annotation that marks a transform: ``input<m>`` or ``output<m>``.
TRANSFORM_KEY = "tvmdsoop.winograd"

#: The narrowest vectors a transform's channels are run in (SSE's 4 floats):
#: winograd.py converts only layers of whole such vectors.
MIN_LANES = 4


def rules(target: Any) -> list[Any]:
    return [WinogradTransform()]


def is_transform(func: Any) -> bool:
    """Whether the PrimFunc ``func`` is a Winograd transform (with what FuseOps
    put beside it)."""
    sch = s_tir.Schedule(func)
    return any(TRANSFORM_KEY in sch.get(block).annotations for block in sch.get_child_blocks(sch.get_sblock("root")))


class WinogradTransform(Rule):
    """A Winograd transform, with what FuseOps put before and after it."""

    def schedule(self, sch: Any, target: Any) -> Any:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        kinds = [str(sch.get(b).annotations.get(TRANSFORM_KEY, "")) for b in blocks]
        last = [i for i, kind in enumerate(kinds) if kind.startswith(("input", "output"))]
        if len(last) != 1 or kinds.count("rows") != 1:
            return None
        position, kind = last[0], kinds[last[0]]
        block, rows = blocks[position], blocks[kinds.index("rows")]
        for i, producer in enumerate(blocks[:position]):
            if kinds[i] != "rows":
                sch.compute_inline(producer)
        for consumer in blocks[position + 1:]:
            sch.reverse_compute_inline(consumer)
        loops = sch.get_loops(block)
        extents = [int(sch.get(loop).extent) for loop in loops]
        lanes = math.gcd(vector_lanes(target), extents[-1])
        if lanes < MIN_LANES:
            return None
        channels, lane = sch.split(loops[-1], [None, lanes])
        m = int(kind.removeprefix("input").removeprefix("output"))
        if kind.startswith("input"):
            # (position in the tile, tile, channel) -> tile, channel vector,
            # row of B^T (rows combined here), column of B, lanes
            row, column = sch.split(loops[0], [None, m + 2])
            sch.reorder(loops[1], channels, row, column, lane)
            threaded, unrolled = loops[1], [row, column]
        else:
            # (image, y, x, channel) -> tiles, channel vector, row of A^T (the
            # tile's rows combined here), column, lanes
            image, y, x = loops[:3]
            tile_row, row = sch.split(y, [None, m])
            tile_column, column = sch.split(x, [None, m])
            sch.reorder(image, tile_row, tile_column, channels, row, column, lane)
            threaded, unrolled = sch.fuse(image, tile_row, tile_column), [row, column]
        # A row of B^T d (or of A^T M) for a vector of channels: (m + 2)
        # vectors, at most 384 bytes, which TVM 0.27 puts on the stack (and
        # LLVM in registers) as a "global" buffer; a "local" one it would
        # allocate with a call in every iteration.
        sch.compute_at(rows, row)
        depth = next(i for i, loop in enumerate(sch.get_loops(block)) if sch.get(loop).same_as(sch.get(row))) + 1
        *rows_unrolled, rows_lanes = sch.get_loops(rows)[depth:]
        if math.prod(extents) >= PARALLEL_MIN_WORK:
            sch.parallel(threaded)
        for loop in [*unrolled, *rows_unrolled]:
            sch.unroll(loop)
        sch.vectorize(lane)
        sch.vectorize(rows_lanes)
        return sch
