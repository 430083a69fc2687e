"""Schedules for functions of elementwise and injective work only: the
activations, reshapes, transposes, residual adds and bias adds that FuseOps
puts together between matrix products (exact GELU's erf and its four
multiplies and adds, for one).

Unscheduled, each of a fused function's blocks is its own loop nest, writing
a whole intermediate buffer that the next one reads back: five passes over a
megabyte for GELU at batch 8. The rule computes every block inside the last
one (``compute_inline``), so that each element is read once, worked on in
registers and written once, in vectors of the target's width.

A transposition (attention's K, its heads' dimension moved after the tokens')
runs in square tiles of a vector's width instead: vectors along the output's
last dimension would gather each of their lanes from another row of the
input (BERT-base's K, 128 x 768 to 12 x 64 x 128: 88 µs so, 9.4 in tiles).
"""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx
from tvm.ir import Range
from tvm.sym import Analyzer

from .fallback import channel_innermost, parallel_elementwise
from .lanes import ELEMENTWISE_PARALLEL_MIN_WORK, SSE_LANES, vector_lanes
from .rule import Rule, has_reduction, plain_loops

#: Vectors per iteration of the vectorized loop: two hide a little latency
#: (LLVM splits the wider vector into registers of the target's width).
VECTORS = 2

#: A gate has at most this fraction of the values it applies to: a channel's
#: one per pixel of the feature map (7x7 at least in the Keras applications).
GATE_RATIO = 16


def rules(target: Any) -> list[Any]:
    return [Elementwise(), GatedElementwise()]


class Elementwise(Rule):
    """Fused injective functions as one vectorized loop nest."""

    def schedule(self, sch: Any, target: Any) -> Any:
        from tvm.relax.analysis import has_reshape_pattern

        if has_reshape_pattern(sch.mod["main"]):
            # Relax's RewriteDataflowReshape makes a reshape a view of its input,
            # no kernel at all, when it recognises its loop nest, unscheduled.
            return None
        return schedule_elementwise(sch, target)


def schedule_elementwise(sch: Any, target: Any) -> Any:
    """``sch`` with all its blocks inlined into its last, whose loops are fused
    into one, run ``VECTORS`` vectors at a time (or left to LLVM's vectorizer,
    which runs a scalar tail, when no whole number of vectors divides it); None
    when a block is not injective (a reduction), when the blocks cannot all be
    inlined, or when there is only one block and nothing to gain."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if not blocks or any(int(v.iter_type) != tirx.IterVar.DataPar
                         for block in blocks for v in sch.get(block).iter_vars):
        return None
    for block in blocks[:-1]:
        sch.compute_inline(block)
    total = _iterations(sch, blocks[-1])
    lanes = vector_lanes(target)
    if total is None:
        return None
    transposition = _transposition(sch, blocks[-1], lanes)
    if transposition is not None:
        _tile_transposition(sch, blocks[-1], *transposition, total)
        return sch
    if len(blocks) == 1 and (total % lanes or total < 2 * lanes):
        return None
    _vectorize(sch, blocks[-1], total, lanes)
    return sch


def _transposition(sch: Any, block: Any, lanes: int) -> tuple[int, int, int] | None:
    """The loops of a transposition, and the side of its square tiles: the
    loop along which ``block`` (every producer inlined) reads an input
    contiguously, and its innermost, along which it writes its output
    contiguously and reads that input a tile's side or more apart; the tile,
    the widest vector of ``lanes`` or fewer (down to SSE's 4) that divides
    both loops and within which each read's index steps evenly along both
    (proved, for every tile: the reshapes and transposes of a fused function
    index through divisions and remainders, which may wrap inside a tile).
    Other reads may be constants, or step by 0 or 1 along the first loop (a
    bias, a scale: a vector or one value in each of the tile's rows). None
    for any other block."""
    stmt = sch.get(block)
    loops = plain_loops(sch, block)
    variables = [v.var for v in stmt.iter_vars]
    if (loops is None or len(stmt.writes) != 1
            or not all(r.min.same_as(var) for r, var in zip(stmt.writes[0].region, variables))):
        return None  # not one loop per block variable, in order, writing the output in that order
    extents = [int(sch.get(loop).extent) for loop in loops]
    last = len(loops) - 1
    reads = []
    for read in stmt.reads:
        shape = _static(read.source.shape)
        if shape is None or _static([r.extent for r in read.region]) != [1] * len(read.region):
            return None
        flat = _flat_index(read, shape)
        strides = _steps(flat, variables, extents)
        if strides is None:
            return None
        reads.append((flat, strides))
    transposed = [strides for _, strides in reads if abs(strides[last]) > 1 and 1 in strides[:last]]
    if not transposed:
        return None
    contiguous = transposed[0].index(1)
    if any(strides[contiguous] not in (0, 1) for _, strides in reads):
        return None
    for tile in (lanes, lanes // 2, lanes // 4):
        if (tile >= SSE_LANES and extents[contiguous] % tile == 0 and extents[last] % tile == 0
                and all(abs(strides[last]) >= tile for strides in transposed)
                and all(_even_in_tiles(flat, strides, variables, extents, (contiguous, last), tile)
                        for flat, strides in reads)):
            return contiguous, last, tile
    return None


def _static(values: Any) -> list[int] | None:
    return [int(v) for v in values] if all(isinstance(v, tirx.IntImm) for v in values) else None


def _flat_index(read: Any, shape: list[int]) -> Any:
    """The element of ``read``'s buffer it reads, as one index (row-major)."""
    flat = read.region[0].min
    for r, size in zip(read.region[1:], shape[1:]):
        flat = flat * size + r.min
    return flat


def _steps(flat: Any, variables: list[Any], extents: list[int]) -> list[int] | None:
    """How far ``flat`` moves for one step of each variable from the origin
    (0 along a loop of one); None where it is not a number there."""

    def at(point: list[int]) -> int | None:
        analyzer = Analyzer()
        for var, value in zip(variables, point):
            analyzer.bind(var, tirx.const(value, var.ty.dtype))
        value = analyzer.simplify(flat)
        return int(value) if isinstance(value, tirx.IntImm) else None

    origin = at([0] * len(variables))
    steps = [at([int(i == axis) for i in range(len(variables))]) if extents[axis] > 1 else origin
             for axis in range(len(variables))]
    return None if origin is None or None in steps else [step - origin for step in steps]


def _even_in_tiles(flat: Any, strides: list[int], variables: list[Any], extents: list[int],
                   tiled: tuple[int, int], tile: int) -> bool:
    """Whether, in every square tile of side ``tile`` along the ``tiled``
    loops, ``flat`` is its value at the tile's corner plus ``strides`` times
    the steps into the tile: each of the tile's vectors one load, or one value."""
    inside, corner = Analyzer(), Analyzer()
    offset = 0
    for axis, (var, extent) in enumerate(zip(variables, extents)):
        if axis in tiled:
            dtype = var.ty.dtype
            tiles, step = tirx.Var(f"tile_{axis}", dtype), tirx.Var(f"in_tile_{axis}", dtype)
            for analyzer in (inside, corner):
                analyzer.bind(tiles, Range(0, extent // tile))
            inside.bind(step, Range(0, tile))
            inside.bind(var, tiles * tile + step)
            corner.bind(var, tiles * tile)
            offset = offset + step * strides[axis]
        else:
            for analyzer in (inside, corner):
                analyzer.bind(var, Range(0, extent))
    return inside.can_prove_equal(inside.simplify(flat) - corner.simplify(flat), offset)


def _tile_transposition(sch: Any, block: Any, contiguous: int, last: int, tile: int, total: int) -> None:
    """``block``'s two transposed loops split into square tiles of ``tile``,
    each read in vectors along ``contiguous`` (one vector from each of
    ``tile`` rows of the input), the vectors' loop unrolled, so that LLVM
    transposes the tile in registers instead of gathering each lane from
    memory; on TVM's threads when large."""
    loops = sch.get_loops(block)
    along_outer, along = sch.split(loops[contiguous], [None, tile])
    across_outer, across = sch.split(loops[last], [None, tile])
    outer = [loop for i, loop in enumerate(loops) if i not in (contiguous, last)] + [along_outer]
    sch.reorder(*outer, across_outer, across, along)
    sch.vectorize(along)
    sch.unroll(across)
    if total >= ELEMENTWISE_PARALLEL_MIN_WORK:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


class GatedElementwise(Rule):
    """Functions that reduce to a few values first, then work elementwise on a
    large tensor with them: a squeeze-and-excitation block's gate (a 1x1
    convolution of the pooled channels, a sigmoid) times the block's feature
    map, of which EfficientNetB0 has 16. Inlining the reductions would repeat
    them for each element, so they stay loop nests of their own, scheduled as
    the fallback would; the last block runs as ``schedule_elementwise``'s do.
    The fallback, which ran these before, vectorized the last block's
    innermost loop alone: EfficientNetB0's first gate (112x112x32 elements)
    took 114 µs on two threads, 19 µs with this rule; its 16 gates 290, 206."""

    def schedule(self, sch: Any, target: Any) -> Any:
        *prologue, last = sch.get_child_blocks(sch.get_sblock("root"))
        total = _iterations(sch, last)
        if (total is None or has_reduction(sch.get(last))
                or not any(has_reduction(sch.get(block)) for block in prologue)
                or any(_outputs(sch.get(block)) * GATE_RATIO > total for block in prologue)):
            return None  # an average pool's division by the window, for one: the pool rule's
        for block in prologue:
            if has_reduction(sch.get(block)):
                channel_innermost(sch, block)
            else:
                parallel_elementwise(sch, block)
        # The gate is one value per channel (the last axis): vectors along the
        # channels read it contiguously, where vectors across the fused loops
        # would gather it whenever the channels are not a whole number of them.
        *outer, channels = sch.get_loops(last)
        lanes = vector_lanes(target)
        if int(sch.get(channels).extent) % lanes == 0:
            sch.vectorize(sch.split(channels, [None, lanes])[1])
        if outer and total >= ELEMENTWISE_PARALLEL_MIN_WORK:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return sch


def _outputs(block: Any) -> int:
    """How many values a block (its statement) computes: its data-parallel
    iterations."""
    return math.prod(int(v.dom.extent) for v in block.iter_vars
                     if int(v.iter_type) == tirx.IterVar.DataPar and isinstance(v.dom.extent, tirx.IntImm))


def _iterations(sch: Any, block: Any) -> int | None:
    """How many times ``block``'s loop nest runs it; None unless every extent
    is known."""
    extents = _static([sch.get(loop).extent for loop in sch.get_loops(block)])
    return math.prod(extents) if extents else None


def _vectorize(sch: Any, block: Any, total: int, lanes: int) -> None:
    """``block``'s loops (``total`` iterations) fused into one, run ``VECTORS``
    vectors at a time (or left to LLVM's vectorizer, which runs a scalar tail,
    when no whole number of vectors divides it), on TVM's threads when large."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    # The widest run of whole vectors that divides the loop nest: no tail to predicate.
    width = next((w for w in (VECTORS * lanes, lanes) if total % w == 0), None)
    if width is None:
        outer = fused
    else:
        outer, inner = sch.split(fused, [None, width])
        sch.vectorize(inner)
    if total >= ELEMENTWISE_PARALLEL_MIN_WORK:
        sch.parallel(outer)
