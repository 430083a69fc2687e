"""TVM's add_one for CUDA, in the two forms the GPU checks use.

    python tvm_add_one.py cuda-host OUT.cu        # CUDA C++ for nvcc
    python tvm_add_one.py export-library OUT.so   # tvm.compile + export_library

apache-tvm compiles ``add_one(x: float32[n]) -> float32[n]`` for target ``cuda``.

- ``cuda-host`` (host ``cuda_host``): one translation unit holding TVM's kernel and
  TVM's host wrapper, which checks the arguments and launches the kernel on
  ``TVMFFIEnvGetStream``. nvcc turns it into a tvm-ffi library that needs only
  libtvm_ffi.so and the CUDA driver.
- ``export-library`` (host ``llvm``): the usual TVM library, whose CUDA code TVM's
  CUDA runtime loads. Built here without a CUDA driver, it carries CUDA source
  (TVM_COMPILE_FORCE_FALLBACK makes that so on every machine), which only TVM's
  Python package can compile when it loads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tvm
from tvm import te
from tvm.backend.cuda import export_cuda_host

#: Threads a block, and elements a thread: a block covers THREADS * PER_THREAD
#: consecutive elements, each thread every THREADS-th of them (coalesced), and the
#: kernel is launched over ceil(n / (THREADS * PER_THREAD)) blocks. Several
#: elements a thread keep enough loads in flight to come near the GPU's copy
#: bandwidth (one a thread reached 0.78 of it on an H100). add_one_raw_launch.cu
#: launches the same way.
THREADS = 256
PER_THREAD = 4


def add_one() -> tvm.IRModule:
    n = te.var("n")
    x = te.placeholder((n,), name="x", dtype="float32")
    y = te.compute((n,), lambda i: x[i] + 1.0, name="y")
    mod = tvm.IRModule({"add_one": te.create_prim_func([x, y]).with_attr("global_symbol", "add_one")})
    sch = tvm.s_tir.Schedule(mod)
    sch.work_on("add_one")
    blocks, each, threads = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, PER_THREAD, THREADS])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")
    sch.unroll(each)
    return sch.mod


def write_cuda_host(out: str) -> None:
    # The arch only shapes the generated source; nvcc picks the GPU code to emit.
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="cuda_host")
    Path(out).write_text(export_cuda_host(tvm.compile(add_one(), target=target).mod))


def write_export_library(out: str) -> None:
    os.environ["TVM_COMPILE_FORCE_FALLBACK"] = "1"
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm")
    tvm.compile(add_one(), target=target).export_library(out)


if __name__ == "__main__":
    form, out = sys.argv[1:]
    {"cuda-host": write_cuda_host, "export-library": write_export_library}[form](out)
