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

from .lanes import PARALLEL_MIN_WORK, vector_lanes
from .rule import Rule

#: Vectors per iteration of the vectorized loop: two hide a little latency
#: (LLVM splits the wider vector into registers of the target's width).
VECTORS = 2


def rules(target: Any) -> list[Any]:
    return [Elementwise()]


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
    last = blocks[-1]
    loops = sch.get_loops(last)
    extents = [sch.get(loop).extent for loop in loops]
    if not loops or not all(isinstance(n, tirx.IntImm) for n in extents):
        return None
    total = math.prod(int(n) for n in extents)
    lanes = vector_lanes(target)
    # The widest run of whole vectors that divides the loop nest: no tail to predicate.
    width = next((w for w in (VECTORS * lanes, lanes) if total % w == 0), None)
    if len(blocks) == 1 and (width is None or total < 2 * lanes):
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if width is None:
        outer = fused
    else:
        outer, inner = sch.split(fused, [None, width])
        sch.vectorize(inner)
    if total >= PARALLEL_MIN_WORK:
        sch.parallel(outer)
    return sch
