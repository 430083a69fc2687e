"""How many elements one vector register of the target holds."""

from __future__ import annotations

from typing import Any


def vector_lanes(target: Any, bits: int = 32) -> int:
    """Elements of ``bits`` bits in one of ``target``'s vector registers: from
    the features LLVM enables for it (AVX-512: 512-bit registers, AVX: 256,
    else SSE's 128), not ``llvm_get_vector_width``, which says 512 for every
    x86-64 target."""
    from tvm.target import codegen

    features = set(codegen.llvm_get_cpu_features(target))
    width = 512 if "avx512f" in features else 256 if "avx" in features else 128
    return width // bits
