"""The schedule of an expansion convolution fused into the strided depthwise
convolution after it (``expansion_fusion`` merges the two; why, and what it
gained, is said there).

The loop nest FuseTIR makes of the pair: the 1x1 convolution's sum, its
epilogue (bias, batch norm, activation) writing the wide tensor, the depthwise
convolution's padding, its sum and its epilogue. Here the output is cut into
bands of rows, run on TVM's threads; in each band the wide rows it reads (the
band's rows at stride 2, and the kernel's overlap) are computed into a buffer
of the band's, which stays in L2, then the band's output from it. Inside, each
convolution keeps the register tiles of ``conv.ConvNHWC`` (columns by vectors
of output channels, the sum over the tile, the epilogue on it before it is
stored), and each output element is summed in the same order as in TOPI's
nest: the same results to the bit.
"""

from __future__ import annotations

from typing import Any

from tvm import ir

from .conv import _CACHED_INPUT, ConvNHWC, _conv_shape, _reached, in_registers, sum_in_tile
from .lanes import vector_lanes
from .rule import Rule, has_reduction

#: The most bytes of wide rows a band keeps: half of a core's L2 (1 MiB on
#: Cascade Lake, 2 MiB on Sapphire Rapids), the rest for the weights and output.
_BAND_BYTES = 512 << 10

#: The most wide rows a band may compute that another computes too, of those
#: it needs: an eighth (3x3 kernels, bands of 4 rows or more). EfficientNetB0's
#: 5x5 stride-2 layers, recomputing 3 in 8 in bands of 4, ran as fast as apart
#: (its 3x3 one 1.02 times the model's speed alone).
_RECOMPUTED = 1 / 8

#: The most output rows a band takes, and the fewest bands an image is cut
#: into, so that two threads share them evenly.
_BAND_ROWS, _MIN_BANDS = 8, 4


class ExpansionDepthwise(Rule):
    """A 1x1 convolution and the stride-2 depthwise convolution that reads it,
    in bands of output rows."""

    def __init__(self, lanes: int) -> None:
        self.tiles = ConvNHWC(lanes)

    @classmethod
    def for_target(cls, target: Any) -> ExpansionDepthwise:
        return cls(vector_lanes(target))

    def schedule(self, sch: Any, _target: Any) -> Any:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        reductions = [i for i, b in enumerate(blocks) if has_reduction(sch.get(b))]
        if len(reductions) != 2:
            return None
        first, second = reductions
        expand, depthwise = blocks[first], blocks[second]
        shapes = _conv_shape(sch, expand), _conv_shape(sch, depthwise)
        if shapes[0] is None or shapes[1] is None or shapes[0].depthwise or not shapes[1].depthwise:
            return None
        wide, depth = shapes
        weight = [int(n) for n in wide.weight.shape]
        wide_rows, wide_width = (int(sch.get(loop).extent) for loop in sch.get_loops(expand)[1:3])
        out_rows = int(sch.get(sch.get_loops(depthwise)[1]).extent)
        kernel = int(depth.weight.shape[0])
        if weight[:2] != [1, 1] or wide_rows != 2 * out_rows:
            return None  # not a 1x1 expansion, or a depthwise convolution of another stride
        row_bytes = 4 * wide_width * wide.channels
        if wide_rows * row_bytes <= _CACHED_INPUT:
            return None  # a wide tensor that stays in L2 anyway: nothing to gain
        # A band of d output rows reads 2d - 2 + kernel wide rows: kernel - 2 of
        # them another band computes too.
        bands = [d for d in range(min(_BAND_ROWS, out_rows), 0, -1)
                 if out_rows % d == 0 and out_rows // d >= _MIN_BANDS and (kernel - 2) / (2 * d) <= _RECOMPUTED
                 and (2 * d - 2 + kernel) * row_bytes <= _BAND_BYTES]
        if not bands:
            return None

        # The blocks: what the expansion reads (its padding, none for 1x1),
        # its epilogue, the depthwise convolution's padding, its epilogue.
        before, between, after = blocks[:first], blocks[first + 1:second], blocks[second + 1:]
        reads_wide, wide_reads = _reached(sch, expand, sch.get_consumers), _reached(sch, expand, sch.get_producers)
        padding = [b for b in between if _is_padding(sch.get(b)) and _feeds_only(sch, b, depthwise)]
        epilogue = [b for b in between if b not in padding]
        if (not epilogue or not after or len(padding) > 1
                or any(str(sch.get(b).name_hint) not in reads_wide for b in between)
                or any(str(sch.get(b).name_hint) not in wide_reads for b in before)):
            return None
        for block in before + epilogue[:-1] + padding + after[:-1]:
            sch.compute_inline(block)
        wide_out, out = epilogue[-1], after[-1]

        # The output: bands of rows, then ConvNHWC's tiles.
        band = bands[0]
        w_tile, vectors, lanes = self.tiles.tile(depth.width, depth.channels, True)
        n, h, w, c = sch.get_loops(out)
        band_loop, rows = sch.split(h, [None, band])
        wo, wi = sch.split(w, [None, w_tile])
        co, ck, cv = sch.split(c, [None, vectors, lanes])
        sch.reorder(n, band_loop, rows, co, wo, wi, ck, cv)
        sum_tile, ry = sum_in_tile(sch, depthwise, wo, vectors, lanes)
        tiles = [sum_tile, (wi, ck, cv)]

        # The band's wide rows, each in the expansion's own tiles.
        sch.compute_at(wide_out, band_loop, preserve_unit_loops=True)
        *_, eh, ew, ec = sch.get_loops(wide_out)
        w_tile, vectors, lanes = self.tiles.tile(wide.width, wide.channels, False)
        ewo, ewi = sch.split(ew, [None, w_tile])
        eco, eck, ecv = sch.split(ec, [None, vectors, lanes])
        sch.reorder(eh, eco, ewo, ewi, eck, ecv)
        sum_tile, wide_ry = sum_in_tile(sch, expand, ewo, vectors, lanes)
        tiles += [sum_tile, (ewi, eck, ecv)]

        sch.parallel(sch.fuse(n, band_loop))
        in_registers(sch, tiles)
        sch.decompose_reduction(depthwise, ry)
        sch.decompose_reduction(expand, wide_ry)
        return sch


def _is_padding(block: Any) -> bool:
    """Whether ``block`` is TOPI's padding: a value or zero, by a condition."""
    value = getattr(block.body, "value", None)
    return isinstance(value, ir.Call) and str(value.op.name).endswith("if_then_else")


def _feeds_only(sch: Any, block: Any, consumer: Any) -> bool:
    """Whether ``consumer`` is the only block that reads what ``block`` writes."""
    return [str(sch.get(b).name_hint) for b in sch.get_consumers(block)] == [str(sch.get(consumer).name_hint)]
