"""What the schedules size their work by: how many elements one vector
register of the target holds, and how much work is worth TVM's threads."""

from __future__ import annotations

from typing import Any


#: Lanes of float32 in SSE's registers: the narrowest vectors a tile is made of.
SSE_LANES = 4


def vector_lanes(target: Any, bits: int = 32) -> int:
    """Elements of ``bits`` bits in one of ``target``'s vector registers: from
    the features LLVM enables for it (AVX-512: 512-bit registers, AVX: 256,
    else SSE's 128), not ``llvm_get_vector_width``, which says 512 for every
    x86-64 target."""
    from tvm.target import codegen

    features = set(codegen.llvm_get_cpu_features(target))
    width = 512 if "avx512f" in features else 256 if "avx" in features else 128
    return width // bits


#: The least work (iterations of a loop nest) worth splitting over TVM's
#: threads: waking them costs microseconds, a few times what this takes. The
#: fallback schedule (fallback.channel_innermost) uses it too.
PARALLEL_MIN_WORK = 1 << 18

#: The least elements of a fused elementwise or injective function worth
#: splitting over TVM's threads: each is a load and a store, so fewer of them
#: take as long as PARALLEL_MIN_WORK's multiply-adds. The transformer block's
#: head transpositions at batch 8 (65536 elements) on two threads: the block
#: 1.025 times as fast (Zen 5, TVM's VM, 15 rounds in turns; q1 1.023), the
#: BERT-base layer, MobileNetV2 and EfficientNetB0 even (1.005, 0.998, 1.000).
ELEMENTWISE_PARALLEL_MIN_WORK = 1 << 16
