"""Schedules for functions of elementwise and injective work only: the
activations, reshapes, transposes, residual adds and bias adds that FuseOps
puts together between matrix products (exact GELU's erf and its four
multiplies and adds, for one).

Unscheduled, each of a fused function's blocks is its own loop nest, writing
a whole intermediate buffer that the next one reads back: five passes over a
megabyte for GELU at batch 8. The rule computes every block inside the last
one (``compute_inline``), so that each element is read once, worked on in
registers and written once, in vectors of the target's width.
"""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

from .fallback import channel_innermost, parallel_elementwise
from .lanes import PARALLEL_MIN_WORK, vector_lanes
from .rule import Rule, has_reduction

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
    if total is None or (len(blocks) == 1 and (total % lanes or total < 2 * lanes)):
        return None
    _vectorize(sch, blocks[-1], total, lanes)
    return sch


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
        if outer and total >= PARALLEL_MIN_WORK:
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
    extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
    if not extents or not all(isinstance(n, tirx.IntImm) for n in extents):
        return None
    return math.prod(int(n) for n in extents)


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
    if total >= PARALLEL_MIN_WORK:
        sch.parallel(outer)
