"""Schedules for convolutions (NHWC conv2d, 1x1 and larger, and depthwise).

TOPI writes an NHWC convolution as one reduction block over (n, h, w, c, ry,
rx, rc), after a ``pad_temp`` block and before the elementwise blocks FuseOps
put behind it (bias, activation, batch norm, residual add). Untuned, each
output element is summed alone, loading and storing it on every step. The
schedule here is the register tiling of TOPI's old x86 kernels
(``conv2d_avx_common``, ``conv2d_avx_1x1``): a tile of output columns by
vectors of output channels lives in registers while the reduction (ry, rx,
rc) runs over it; each step loads the tile's weights once for all its columns
and one input value per column (broadcast; in a depthwise convolution, an
input vector). The epilogue runs on the tile before it leaves the registers;
the padding test is inlined into the sum. The output channel is the
vectorised axis: it is contiguous in the NHWC output, in the HWIO weights
(HWOI with one input channel in a depthwise one) and, in a depthwise
convolution, in the input. Every output element's sum runs in the same order
as in TOPI's nest, so the results are the same to the bit.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tvm import sym, tirx

from .lanes import vector_lanes
from .rule import Rule, has_reduction, is_constant, plain_loops

#: Vector registers an x86 core has: 32 with AVX-512, 16 before it.
_REGISTERS = {16: 32, 8: 16, 4: 16}

#: Input bytes (of all the images a channel tile passes) that stay in a
#: core's L2 cache beside the tile's weights: in 2 MiB here (Sapphire Rapids),
#: 1 MiB beat 512 KiB by 1.25x on ResNet50's 7x7x512 3x3 conv at batch 8.
_CACHED_INPUT = 1 << 20

#: Independent accumulators it takes to keep an x86 core's FMA units busy: two
#: units, each starting an FMA every cycle that takes four to finish.
_FMA_CHAINS = 8

#: The least multiply-adds a convolution splits over TVM's threads: below the
#: other rules' PARALLEL_MIN_WORK, as a register-tiled multiply-add takes a
#: fraction of a cycle. The small CNN's two convolutions at batch 1 (221k and
#: 226k multiply-adds) took 4.5 and 4.2 µs on one thread, 3.3 and 3.0 on two
#: (Zen 4, the workers spinning between kernels); the model 10.8 -> 9.1 µs.
PARALLEL_MIN_MULTIPLY_ADDS = 1 << 17


def rules(target: Any) -> list[Any]:
    """The convolution rules for an llvm ``target``."""
    return [ConvNHWC(vector_lanes(target))]


class ConvNHWC(Rule):
    """Register-tiled NHWC conv2d and depthwise conv2d, epilogue fused."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.registers = _REGISTERS.get(lanes, 16)

    def schedule(self, sch: Any, _target: Any) -> Any:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        reductions = [i for i, b in enumerate(blocks) if has_reduction(sch.get(b))]
        if len(reductions) != 1:
            return None
        at = reductions[0]
        conv = blocks[at]
        # What the sum reads (pad_temp) is inlined into it, and what reads the
        # sum (the epilogue) is computed on its tile. The other blocks compute
        # from the weights alone: with runtime weights, batch norm's scale and
        # shift from the moving statistics, a vector per channel. Those before
        # the sum stay loop nests of their own, run once before it; those after
        # it (FuseTIR leaves them where Relax had them) are inlined into the
        # epilogue, which cannot wait for a loop nest after the sum's.
        upstream, downstream = _reached(sch, conv, sch.get_producers), _reached(sch, conv, sch.get_consumers)
        producers = [b for b in blocks[:at] if _name(sch, b) in upstream]
        epilogue = [b for b in blocks[at + 1:] if _name(sch, b) in downstream]
        shifts = [b for b in blocks[at + 1:] if _name(sch, b) not in downstream]
        shape = _conv_shape(sch, conv)
        others = blocks[:at] + blocks[at + 1:]
        if shape is None or len(producers) > 1 or any(has_reduction(sch.get(b)) for b in others):
            return None
        w_tile, vectors, lanes = self.tile(shape.width, shape.channels, shape.depthwise)
        weights_first = shape.weight_size > shape.image_size
        extents = [int(sch.get(loop).extent) for loop in sch.get_loops(conv)]

        # The epilogue, one block reading the accumulator: every block but the
        # last inlined into the next; without one, a copy out of the tile. The
        # accumulator stays a "global" buffer, which TVM compacts to the tile:
        # under 1 KiB, TVM 0.27 puts a global buffer on the stack, where LLVM
        # keeps it in registers, but sends a "local" one of any size through a
        # call of TVMBackendAllocWorkspace and its free (for every row of tiles:
        # 8% of the Keras CNN's call at batch 32).
        for block in shifts + epilogue[:-1]:
            sch.compute_inline(block)
        if epilogue:
            out = epilogue[-1]
        else:
            out = sch.cache_write(conv, 0, "global")  # the copy; conv now sums into the tile
        for block in producers:  # pad_temp: its reads, with the padding test, go into the sum
            sch.compute_inline(block)

        # The tiles are the output's: the sum is computed in each (compute_at),
        # rather than the epilogue in the sum's loops (reverse_compute_at), which
        # TVM refuses where a block before the sum computes what the epilogue reads.
        loops = sch.get_loops(out)
        if [int(sch.get(loop).extent) for loop in loops] != extents[:4]:
            return None  # an epilogue of another shape
        n, h, w, c = loops
        wo, wi = sch.split(w, [None, w_tile])
        co, ck, cv = sch.split(c, [None, vectors, lanes])
        if weights_first:
            # The loop over channel tiles outside the rows and the images (as
            # many as fit in cache): each tile's weights, copied contiguous, stay
            # in cache while those images' rows pass.
            images = _divisors(shape.batch, max(1, _CACHED_INPUT // shape.image_size))[0]
            nb, ni = sch.split(n, [None, images])
            outer, inner = [nb, co], [ni, h]
        else:
            # Each row of input stays in cache while every channel tile passes.
            outer, inner = [n, h, co], []
        sch.reorder(*outer, *inner, wo, wi, ck, cv)
        sum_tile, ry = sum_in_tile(sch, conv, wo, vectors, lanes)
        if weights_first:
            # A channel tile's weights copied into [KH][KW][IC][tile] where the
            # tile's loop starts: in HWIO its rows lie OC floats apart, a page
            # apart in the big layers, where the hardware prefetcher stops
            # (1.5-3x on ResNet50's late layers); packed, one contiguous stream.
            index = _read_index(sch.get(conv), shape.weight)
            pack = sch.cache_read(conv, index, "global")
            if is_constant(sch, shape.weight):
                # A weight of the model: packed whole, as [OC / tile][KH][KW][IC][tile],
                # by a block that SplitLayoutRewritePreproc takes out of the
                # function and FoldConstant runs at compile time
                # (compile_model.cpu_pipeline): no copy per call (1.36x on a
                # 7x7x512 3x3 layer at batch 1).
                tile = vectors * lanes
                sch.transform_layout(conv, ("read", index), lambda h, w, i, o: (o // tile, h, w, i, o % tile))
                sch.annotate(pack, "meta_schedule.layout_rewrite_preproc", True)
            else:  # an input (tf_op.auto's runtime weights): each tile's copied where its loop starts
                sch.compute_at(pack, co)
                sch.vectorize(sch.get_loops(pack)[-1])
        # Loop kinds (threads here, vectors below) before decompose_reduction:
        # a block without its init is no reduction to the check that a loop's
        # iterations are independent; the init's loops copy those kinds.
        if math.prod(extents) >= PARALLEL_MIN_MULTIPLY_ADDS:  # the extents of its output and of its sum
            sch.parallel(sch.fuse(*outer))
        in_registers(sch, [sum_tile, (wi, ck, cv)])  # the sum's, the epilogue's
        sch.decompose_reduction(conv, ry)
        return sch

    def tile(self, width: int, channels: int, depthwise: bool) -> tuple[int, int, int]:
        """The register tile: output columns, vectors of output channels per
        column, and lanes per vector. Vectors are whole registers (a power of
        two lanes, the target's register where the channels allow); columns a
        divisor of ``width``, so that no tile runs off the edge. Of the tiles
        whose accumulators fit, one with enough accumulators to keep the FMA
        units busy (``_FMA_CHAINS``), then the one that does the most FMAs per
        value loaded (columns x vectors FMAs for columns + vectors loads)."""
        lanes = math.gcd(channels, self.lanes)  # a power of two: LLVM splits others badly
        tiles = []
        for vectors in _divisors(channels // lanes, max(2, 2 * self.lanes // lanes)):
            # Accumulators take at most 3/4 of the registers: with more, LLVM
            # spills (measured on AVX-512: 7 columns by 2 vectors beat 14 by 2
            # on 3x3 convs). A step keeps ``vectors`` weights live, and one
            # broadcast input (a depthwise one: an input vector per column).
            free = min(self.registers * 3 // 4, self.registers - vectors - (vectors if depthwise else 1))
            columns = _divisors(width, free // vectors)
            if columns:
                tiles.append((columns[0], vectors))
        if not tiles:
            return 1, 1, lanes
        columns, vectors = max(tiles, key=lambda t: (min(t[0] * t[1], _FMA_CHAINS), t[0] * t[1] / (t[0] + t[1])))
        return columns, vectors, lanes


def sum_in_tile(sch: Any, conv: Any, at: Any, vectors: int, lanes: int) -> tuple[tuple[Any, Any, Any], Any]:
    """The convolution ``conv``'s sum computed under the loop ``at`` over
    output tiles, its reduction (ry, rx, rc) around the tile's columns and
    vectors of ``lanes`` channels: the tile's loops (columns, vectors, lanes)
    and the reduction's first loop, where its init is decomposed."""
    sch.compute_at(conv, at, preserve_unit_loops=True)
    *_, column, channel, ry, rx, rc = sch.get_loops(conv)
    sum_ck, sum_cv = sch.split(channel, [vectors, lanes])
    sch.reorder(ry, rx, rc, column, sum_ck, sum_cv)
    return (column, sum_ck, sum_cv), ry


def in_registers(sch: Any, tiles: list[tuple[Any, Any, Any]]) -> None:
    """Each vector of each tile (its columns, vectors and lanes loops) its own
    register: columns and vectors unrolled, the lanes in one vector."""
    for columns, vectors, lanes in tiles:
        sch.unroll(columns)
        sch.unroll(vectors)
        sch.vectorize(lanes)


def _name(sch: Any, block: Any) -> str:
    return str(sch.get(block).name_hint)


def _reached(sch: Any, block: Any, step: Any) -> set[str]:
    """The names of the blocks ``step`` (``sch.get_producers`` or
    ``get_consumers``) reaches from ``block``, transitively."""
    seen: set[str] = set()
    todo = [block]
    while todo:
        for other in step(todo.pop()):
            if _name(sch, other) not in seen:
                seen.add(_name(sch, other))
                todo.append(other)
    return seen


@dataclasses.dataclass
class _Conv:
    """What the schedule needs to know of a convolution."""

    width: int  # of the output
    channels: int  # of the output
    depthwise: bool
    weight: Any  # the weight buffer
    weight_size: int  # bytes
    image_size: int  # bytes of one image's input (padded)
    batch: int


def _conv_shape(sch: Any, block: Any) -> _Conv | None:
    """The convolution ``block`` computes, when it is TOPI's NHWC
    convolution: variables (n, h, w, c) spatial and three reductions, one loop
    each in that order, the output indexed [n, h, w, c], a 4-D weight whose last
    index is c (HWIO) or whose third is (HWOI, depthwise); None otherwise."""
    stmt = sch.get(block)
    kinds = [int(v.iter_type) for v in stmt.iter_vars]
    if kinds != [tirx.IterVar.DataPar] * 4 + [tirx.IterVar.CommReduce] * 3 or len(stmt.writes) != 1:
        return None
    loops = plain_loops(sch, block)
    if loops is None:
        return None
    ivars = [v.var for v in stmt.iter_vars]
    write = stmt.writes[0].region
    if len(write) != 4 or not all(r.min.same_as(v) for r, v in zip(write, ivars)):
        return None
    extents = [v.dom.extent for v in stmt.iter_vars]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    channel = ivars[3]
    weight = data = None
    for read in stmt.reads:
        region = read.region
        if len(region) != 4:
            return None
        if region[3].min.same_as(channel) and weight is None:
            weight, depthwise = read, False
        elif region[2].min.same_as(channel) and weight is None:
            weight, depthwise = read, True
        else:
            data = read
    if weight is None or data is None or _uses(data.region[3].min, channel) != depthwise:
        return None
    if any(buffer.dtype != "float32" for buffer in (weight.source, data.source, stmt.writes[0].source)):
        return None  # the tiles are sized for float32 vectors
    shapes = [list(read.source.shape) for read in (weight, data)]
    if not all(isinstance(n, tirx.IntImm) for shape in shapes for n in shape):
        return None
    # The input an image's convolution reads: a strided one with a smaller
    # kernel (ResNet's 1x1 stride-2 projections) skips rows and columns.
    read = [min(int(shapes[1][d]), _touched(data.region[d].min, ivars[d], ivars[d + 3], int(extents[d]),
                                            int(extents[d + 3]))) for d in (1, 2)]
    return _Conv(width=int(extents[2]), channels=int(extents[3]), depthwise=depthwise, weight=weight.source,
                 weight_size=4 * math.prod(int(n) for n in shapes[0]),
                 image_size=4 * read[0] * read[1] * int(shapes[1][3]), batch=int(shapes[1][0]))


def _touched(index: Any, out: Any, tap: Any, outputs: int, taps: int) -> int:
    """Input rows (or columns) that ``index``, a function of the output's
    ``out`` and the kernel's ``tap``, reads: ``outputs`` strided windows of
    ``taps``, overlapping or not."""
    def at(o: int, t: int) -> int:
        analyzer = sym.Analyzer()
        analyzer.bind(out, o)
        analyzer.bind(tap, t)
        value = analyzer.simplify(index)
        return int(value) if isinstance(value, tirx.IntImm) else 0

    stride = at(1, 0) - at(0, 0)
    return outputs * taps if taps < stride else (outputs - 1) * stride + taps


def _read_index(block: Any, buffer: Any) -> int:
    """Where ``block`` reads ``buffer`` in its list of reads."""
    return next(i for i, read in enumerate(block.reads) if read.source.same_as(buffer))


def _uses(expr: Any, var: Any) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit``, largest first."""
    return [d for d in range(min(n, limit), 0, -1) if n % d == 0]
