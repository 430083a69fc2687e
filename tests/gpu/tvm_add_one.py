"""Writes the CUDA C++ of a TVM-compiled add_one, for nvcc.

    python tvm_add_one.py OUT.cu

apache-tvm compiles ``add_one(x: float32[n]) -> float32[n]`` for target ``cuda``
with host ``cuda_host``: one translation unit holding TVM's kernel and TVM's
host wrapper, which checks the arguments and launches the kernel on
``TVMFFIEnvGetStream``. nvcc turns it into a tvm-ffi library that needs only
libtvm_ffi.so and the CUDA driver. (A library from ``export_library`` would need
TVM's CUDA runtime, and NVRTC where its CUDA code was not compiled ahead of time.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import tvm
from tvm import te
from tvm.backend.cuda import export_cuda_host

#: Threads a block; the kernel is launched over ceil(n / THREADS) blocks.
THREADS = 256


def add_one() -> tvm.IRModule:
    n = te.var("n")
    x = te.placeholder((n,), name="x", dtype="float32")
    y = te.compute((n,), lambda i: x[i] + 1.0, name="y")
    mod = tvm.IRModule({"add_one": te.create_prim_func([x, y]).with_attr("global_symbol", "add_one")})
    sch = tvm.s_tir.Schedule(mod)
    sch.work_on("add_one")
    blocks, threads = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, THREADS])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")
    return sch.mod


def main(out: str) -> None:
    # The arch only shapes the generated source; nvcc picks the GPU code to emit.
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="cuda_host")
    built = tvm.compile(add_one(), target=target)
    Path(out).write_text(export_cuda_host(built.mod))


if __name__ == "__main__":
    main(sys.argv[1])
