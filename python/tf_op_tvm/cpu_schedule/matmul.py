"""Schedules for matrix products: dense layers, matmul and batch_matmul (the
softmax, layer norms and elementwise work around them in a transformer block
are ``reduction``'s and ``elementwise``'s).

A matrix product here is any loop nest with one reduction block
``C[b.., m.., n] += A[b.., m.., k] * B[b.., k, n]`` (TFLite's FULLY_CONNECTED
becomes ``permute_dims(W)`` then ``matmul``, so dense layers have this form too),
with elementwise work before it (reshapes) and after it (bias, activation, a
residual add) that FuseOps put in the same function. The rule computes C in
register tiles, as old TVM's x86 ``dense_pack`` did: ``mt`` rows by ``nt``
columns of C stay in vector registers while k runs, the ``nt`` columns are
``nt / lanes`` whole vectors of B's row, and each of the ``mt`` values of A is
broadcast once per k. Each output's sum still runs over k in order, so results
are those of the untuned loop nest. The epilogue runs on each tile as it is
finished, from the tile, instead of on a whole output written and read back.
A dense layer's weight, a constant of the model, is repacked at compile time
so that each column tile reads its weights as one stream (MobileNetV2's
1280 x 1000 classifier at batch 1: 154 to 110-124 µs). Where a column tile of
B outsizes L1's share, the sum over k runs in chunks (``k_chunk``).
"""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

from .lanes import PARALLEL_MIN_WORK, SSE_LANES, vector_lanes
from .rule import Rule, is_constant, plain_loops

#: Most rows of C in one register tile: more does not cut loads further and
#: makes the unrolled body long.
MAX_TILE_ROWS = 8

#: Most vectors across one register tile of several rows. A single row (a
#: dense layer at batch 1) takes as many as it has registers: fewer passes over
#: k, and B read in longer runs (1x256 by 256x512: 3.3 -> 3.1 us on AVX-512,
#: 9.3 -> 8.1 on SSE2).
MAX_TILE_VECTORS = 4

#: Most bytes of a column tile's B that the row tiles of a chunk read in
#: turn (``k_chunk``): half of the 32 KiB L1 data cache of x86-64 cores since
#: Sandy Bridge and Zen, the rest left to A's and C's rows. A whole column
#: tile of K = 512 by 64 (the transformer block's FFN-down on AVX-512) is
#: 128 KiB, which every row tile streamed from L2 again. Measured 8, 16 and
#: 32 KiB: 16 the fastest.
L1_PANEL_BYTES = 16 * 1024

#: Most bytes of C's rows in one chunk: the chunk's rows are loaded and stored
#: once per chunk of k, from L1.
CHUNK_ROWS_BYTES = 8 * 1024

#: Fewest steps of k in a chunk: fewer, and loading and storing C's tiles
#: between chunks costs what the chunk saves.
MIN_K_CHUNK = 16

#: Bytes of a weight beyond which each thread takes whole column tiles, not
#: rows: a core's L2 (1 MiB on Zen 4 and Skylake-SP). With rows outermost,
#: each thread reads all of B for each chunk of its rows, and a B larger than
#: L2 comes from L3 or memory each time; with columns outermost, each thread
#: reads its columns' B once and keeps it in L2 across its rows. Below it,
#: rows stay outermost: each core then holds whole rows of C, which the next
#: kernel (a layer norm, a residual add) reads row by row from its own L2 (the
#: transformer block's 64x128 by 128x512 products at batch 1: 6 % slower by
#: columns).
#: BERT-base's layer at batch 1 (2.4 and 9.4 MB weights): 7.7 % faster.
COLUMNS_OUTSIDE_WEIGHT_BYTES = 1 << 20

#: Fewest rows of C for which a B stored as (N, K) is worth copying as (K, N)
#: first: the copy costs about what one row of C does.
MIN_ROWS_TO_TRANSPOSE = 8


def rules(target: Any) -> list[Any]:
    return [Matmul()]


def accumulator_registers(target: Any) -> int:
    """Vector registers a register tile of C may take: AVX-512 has 32, SSE and
    AVX 16; the rest hold B's vectors and A's broadcast value."""
    from tvm.target import codegen

    return 24 if "avx512f" in set(codegen.llvm_get_cpu_features(target)) else 12


def broadcast_cost(target: Any) -> int:
    """Instructions that broadcast one float of A to a vector: AVX loads it so
    (vbroadcastss); SSE loads it, then shuffles it."""
    from tvm.target import codegen

    return 1 if "avx" in set(codegen.llvm_get_cpu_features(target)) else 2


def tile_shape(m: int, n: int, lanes: int, registers: int, broadcast: int = 1) -> tuple[int, int] | None:
    """Rows and columns of C's register tile: ``nt`` a multiple of ``lanes``
    dividing ``n`` (or a whole row of up to ``MAX_TILE_VECTORS`` vectors, the
    last one partly used: a classifier's 10 outputs; else the same with half
    as many lanes, down to SSE's 4), ``mt`` dividing ``m``, within
    ``registers`` vectors of accumulators, with the fewest instructions
    loading operands (mt broadcasts of A, of ``broadcast`` instructions each,
    and nt / lanes vectors of B) per multiply-add; None when n has no such
    tile (a wider row that is not whole vectors of 4). On SSE, 2 x 16 runs 10%
    faster than 4 x 8 (a 512x128 by 128x128 product: 0.43 against 0.46 ms);
    with AVX2, 4 x 16 20% faster than 2 x 32."""
    if n % lanes:
        vectors = -(-n // lanes)
        if vectors <= MAX_TILE_VECTORS:
            return _largest_divisor(m, min(MAX_TILE_ROWS, registers // vectors)), n
        # A wider row that is not whole vectors (a classifier's 1000 columns
        # with AVX-512's 16 lanes): tiles of whole narrower vectors, which
        # LLVM packs into the registers as it can. MobileNetV2's 1280 x 1000
        # classifier at batch 1: 378 µs in the fallback's loop nest, 222 so;
        # the whole model 4 % faster (TVM's VM, one process, turn about).
        return tile_shape(m, n, lanes // 2, registers, broadcast) if lanes > SSE_LANES else None
    best: tuple[float, int, int] | None = None
    widest = registers if m == 1 else MAX_TILE_VECTORS  # a row reads each broadcast of A once
    for vectors in range(1, min(widest, n // lanes) + 1):
        if (n // lanes) % vectors:
            continue
        rows = _largest_divisor(m, min(MAX_TILE_ROWS, registers // vectors))
        cost = (broadcast * rows + vectors) / (rows * vectors)
        if best is None or cost < best[0]:
            best = (cost, rows, vectors * lanes)
    return None if best is None else (best[1], best[2])


def k_chunk(k: int, mt: int, nt: int, row_tiles: int, other_tasks: int) -> tuple[int, int] | None:
    """How a product blocks its sum over ``k`` (Goto's GEMM's kc): steps of k
    per chunk and row tiles (of ``mt`` rows) per chunk, when a column tile of B
    (``k`` by ``nt`` float32) outsizes ``L1_PANEL_BYTES`` and more than one
    row tile would read it; else None (the sum runs whole in each tile). The
    chunk of B stays in L1 while the chunk's row tiles pass, where each row
    tile read all of it from L2: the transformer block at batch 8 1.14x as
    fast on AVX-512. Each output still sums over k in order: the same values.
    Chunks of rows are TVM's tasks with the batch and the column tiles
    (``other_tasks`` of them): where those are one, a chunk takes at most half
    the rows, so that two threads still share the product."""
    kc = _largest_divisor(k, L1_PANEL_BYTES // (4 * nt))
    if k * nt * 4 <= L1_PANEL_BYTES or row_tiles < 2 or kc < MIN_K_CHUNK:
        return None
    most = CHUNK_ROWS_BYTES // (4 * nt * mt)
    if other_tasks < 2:
        most = min(most, row_tiles // 2)
    return kc, _largest_divisor(row_tiles, max(1, most))


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, at_most) + 1) if n % d == 0)


#: A loop nest's attribute that keeps the rule's loops on one thread
#: (stacked_products' stacked products, whose docstring says why).
ONE_THREAD = "tvmdsoop.one_thread"


class Matmul(Rule):
    """Register-tiled matrix products, with their prologue and epilogue fused."""

    def schedule(self, sch: Any, target: Any) -> Any:
        return schedule_matmul(sch, target)


def _vars_in(region: Any) -> list[Any]:
    return [v for r in region for v in tirx.analysis.undefined_vars(r.min)]


def _uses(region: Any, var: Any) -> bool:
    return any(v.same_as(var) for v in _vars_in(region))


def schedule_matmul(sch: Any, target: Any) -> Any:
    """``sch`` with its one matrix product register-tiled, or None when its
    function is not one (the schedule is then thrown away)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if any(int(v.iter_type) == tirx.IterVar.CommReduce for v in sch.get(b).iter_vars)]
    if len(reductions) != 1:
        return None
    block = reductions[0]
    stmt = sch.get(block)
    shape = _product_axes(sch, block)
    if shape is None:
        return None
    batch, rows, col, red, transposed = shape
    loops = sch.get_loops(block)
    extents = [int(sch.get(loop).extent) for loop in loops]
    # Only the innermost of C's row loops is tiled; the others run outside, as
    # the batch does (fused with it and split, the epilogue's loops at the tile
    # could not be proven constant: 3 x 64 rows in tiles of 4).
    shared, (batch, row) = batch, (batch + rows[:-1], rows[-1])
    m = extents[row]
    n = extents[col]
    lanes = vector_lanes(target)
    tile = tile_shape(m, n, lanes, accumulator_registers(target), broadcast_cost(target))
    if tile is None or (transposed is not None and m < MIN_ROWS_TO_TRANSPOSE):
        return None
    mt, nt = tile

    # Everything before the product (reshapes, transposes) is read in place by
    # it; everything after it but the last block is computed in that last one.
    position = next(i for i, b in enumerate(blocks) if sch.get(b).same_as(stmt))
    for producer in blocks[:position]:
        sch.compute_inline(producer)
    for consumer in blocks[position + 1:-1]:
        sch.compute_inline(consumer)
    epilogue = blocks[-1] if position < len(blocks) - 1 else None
    if transposed is not None:
        # B is (N, K) (Q K^T): a copy of it as (K, N), for each batch, makes
        # its rows contiguous along C's, as a (K, N) B's are.
        copy = sch.cache_read(block, transposed, "global")
        sch.transform_layout(block, ("read", transposed), lambda *i: (*i[:-2], i[-1], i[-2]))

    weight = _dense_weight(stmt, shape)
    packed = weight is not None and n % nt == 0 and is_constant(sch, stmt.reads[weight].source)
    if packed:
        # A dense layer's weight (K, N), a constant of the model: packed once,
        # at compile time (the conv rule's way: SplitLayoutRewritePreproc and
        # FoldConstant), as [N / nt][K][nt], so that each column tile's
        # weights are one contiguous stream. In (K, N) a tile reads nt floats
        # a row apart, a row of a classifier being 4 KB, where the prefetcher
        # stops at each page.
        pack = sch.cache_read(block, weight, "global")
        sch.transform_layout(block, ("read", weight), lambda k, j: (j // nt, k, j % nt))
        sch.annotate(pack, "meta_schedule.layout_rewrite_preproc", True)
    mo, mi = sch.split(loops[row], [None, mt])
    no, ni = sch.split(loops[col], [None, nt])
    # A B copied per batch (Q K^T) is small (K of a head): its sum stays whole.
    other_tasks = math.prod(extents[i] for i in batch) * -(-n // nt)
    chunk = k_chunk(extents[red], mt, nt, m // mt, other_tasks) if transposed is None else None
    columns_outside = packed and extents[red] * n * 4 > COLUMNS_OUTSIDE_WEIGHT_BYTES
    if chunk is None:
        outer = [loops[i] for i in batch] + ([no, mo] if columns_outside else [mo, no])
        sch.reorder(*outer, loops[red], mi, ni)
        reduction_start = loops[red]
    else:
        # For each chunk of rows and column tile: for each chunk of k, every
        # row tile of the chunk in turn. The tiles' sums wait in C (the
        # output, or with an epilogue the function's C, a chunk of rows)
        # between chunks of k.
        kc, row_tiles = chunk
        mo_outer, mo_inner = sch.split(mo, [None, row_tiles])
        ko, ki = sch.split(loops[red], [None, kc])
        outer = [loops[i] for i in batch] + ([no, mo_outer] if columns_outside else [mo_outer, no])
        sch.reorder(*outer, ko, mo_inner, ki, mi, ni)
        reduction_start = ko
    # Without an epilogue the tile accumulates in the output itself: its
    # addresses do not change while k runs, so LLVM keeps it in registers.
    # With one, it accumulates in C, the function's intermediate buffer, left
    # "global": TVM compacts C to the tile and puts a global buffer under 1 KiB
    # (kMaxStackAlloca) on the stack, where LLVM keeps it in registers too. A
    # "local" C, of any size, TVM 0.27 allocates and frees for each tile with
    # calls of TVMBackendAllocWorkspace (AVX2's 4 x 16 tiles: a 512x128 by
    # 128x512 product 1.23x as fast with a bias, 1.20x with exact GELU, the
    # values the same). A tile of 1 KiB or more (AVX-512's 4 x 64) still
    # takes the calls, as does a chunk's C (its rows, up to CHUNK_ROWS_BYTES),
    # once a chunk of rows and column tile. On AVX-512 the calls cost about
    # what 4 x 32 tiles, on the stack, lose (Zen 4: 4 x 32 from 1.10x as fast
    # to 0.83x, by product and epilogue).
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, outer[-1], preserve_unit_loops=True)
        # The tile's loops in the epilogue: the last is C's row, vectorized;
        # a tile's rows unrolled (a chunk's many rows stay a loop).
        tile_loops = sch.get_loops(epilogue)[len(outer):]
        _vectorize_columns(sch, tile_loops[-1], nt, lanes)
        if len(tile_loops) > 1 and chunk is None:
            sch.unroll(sch.fuse(*tile_loops[:-1]) if len(tile_loops) > 2 else tile_loops[0])
    threaded = outer
    if transposed is not None and shared:  # a B for each batch: copied inside the batch's loops
        sch.compute_at(copy, loops[shared[-1]], preserve_unit_loops=True)
        # The copy is in the last of them, which cannot be fused with the tiles' loops.
        threaded = [loops[i] for i in shared]
    attrs = sch.mod["main"].attrs
    one_thread = bool(attrs and attrs.get(ONE_THREAD))
    if (not one_thread and math.prod(extents) >= PARALLEL_MIN_WORK
            and math.prod(int(sch.get(loop).extent) for loop in outer) > 1):
        sch.parallel(sch.fuse(*threaded) if len(threaded) > 1 else threaded[0])
    # Before decompose_reduction, which copies the loops' kinds to the init
    # block's, and after which the update block no longer counts as a reduction.
    sch.unroll(mi)
    _vectorize_columns(sch, ni, nt, lanes)
    sch.decompose_reduction(block, reduction_start)
    return sch


def _vectorize_columns(sch: Any, columns: Any, nt: int, lanes: int) -> None:
    """A tile's ``nt`` columns as whole vector registers: a loop over the
    vectors, unrolled, around one of a register's lanes, vectorized. LLVM
    takes a vector of 48 floats (3 of AVX-512's) as a type it has no register
    for, and the code it makes of one is many times slower: on AVX-512, 64x128
    by 128x384 took 2.0 ms instead of 47 µs, 128x768 by 768x768 (BERT-base's
    width) 53 ms instead of 1.4, a 1280x1000 classifier (tiles of 5 vectors
    of 8) 846 µs instead of 178. A row narrower than a register (a classifier's
    10 columns) stays one vector."""
    width = math.gcd(nt, lanes)
    if nt > width >= SSE_LANES:
        vectors, lanes_loop = sch.split(columns, [None, width])
        sch.unroll(vectors)
        sch.vectorize(lanes_loop)
    else:
        sch.vectorize(columns)


def _dense_weight(stmt: Any, shape: tuple[list[int], list[int], int, int, int | None]) -> int | None:
    """Where ``stmt`` (a matrix product of ``_product_axes``' ``shape``) reads
    B, when B is a 2-D (K, N) matrix (a dense layer's weight); else None."""
    _, _, col, red, transposed = shape
    if transposed is not None:
        return None
    j, k = stmt.iter_vars[col].var, stmt.iter_vars[red].var
    return next((i for i, read in enumerate(stmt.reads) if len(read.region) == 2
                 and read.region[0].min.same_as(k) and read.region[1].min.same_as(j)), None)


def _product_axes(sch: Any, block: Any) -> tuple[list[int], list[int], int, int, int | None] | None:
    """The loops of a matrix product ``block``, by what they index: the batch
    (A, B and C; or C only), C's rows (A and C only), its column (B and C, C's
    last dimension) and k (the reduction); and which of the block's reads is B
    when B is (N, K), None when it is (K, N) (C's column is B's last dimension
    too). None for any other block, or one whose loops are not one per block
    variable, in order."""
    stmt = sch.get(block)
    loops = plain_loops(sch, block)
    if loops is None or len(stmt.writes) != 1:
        return None
    output = stmt.writes[0]
    if not output.region:  # a scalar: a dot product, not a matrix product
        return None
    inputs = [r for r in stmt.reads if not r.source.same_as(output.source)]
    if len(inputs) != 2 or any(not isinstance(sch.get(loop).extent, tirx.IntImm) for loop in loops):
        return None
    kinds = [int(v.iter_type) for v in stmt.iter_vars]
    reduce = [i for i, kind in enumerate(kinds) if kind == tirx.IterVar.CommReduce]
    if len(reduce) != 1 or any(kind not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce) for kind in kinds):
        return None
    k = stmt.iter_vars[reduce[0]].var
    column = next((i for i, v in enumerate(stmt.iter_vars) if v.var.same_as(output.region[-1].min)), None)
    if column is None or reduce[0] < column:
        return None
    var = stmt.iter_vars[column].var
    users = [r for r in inputs if _uses(r.region, var)]
    if len(users) != 1 or not _uses(users[0].region, k) or len(users[0].region) < 2:
        return None
    b, a = users[0], next(r for r in inputs if r is not users[0])
    if b.region[-1].min.same_as(var):
        transposed = None
    elif b.region[-2].min.same_as(var) and b.region[-1].min.same_as(k):
        transposed = next(i for i, r in enumerate(stmt.reads) if r.same_as(b))
    else:
        return None
    if not _uses(a.region, k):
        return None
    batch, rows = [], []
    for i, v in enumerate(stmt.iter_vars):
        if i in (column, reduce[0]):
            continue
        if not _uses(output.region, v.var):
            return None
        (batch if _uses(b.region, v.var) or not _uses(a.region, v.var) else rows).append(i)
    # Batch loops outside C's rows, the rows outside its column: the order
    # TOPI writes them in.
    if not rows or (batch and max(batch) > rows[0]) or rows[-1] > column:
        return None
    return batch, rows, column, reduce[0], transposed
