"""Builds the TVM modules the tests call.

Run in its own process (``python build_modules.py OUT_DIR``): TVM's compiler
carries its own LLVM, and the tests keep it out of the TensorFlow process. It
writes two libraries:

- ``OUT_DIR/testfuncs.so``: functions compiled by apache-tvm (``tvm.compile``);
- ``OUT_DIR/ffifuncs.so``: ffi_funcs.cc, built with apache-tvm-ffi's C++ export
  macros (complex dtypes, pointer probes, deliberate errors);
- ``OUT_DIR/cudafuncs.so``: ``add_one`` compiled by apache-tvm for target
  ``cuda``; its CUDA code needs TVM's CUDA runtime to load;
- ``OUT_DIR/matmul.so``: ``matmul(a, b: float32[512, 512]) -> float32[512, 512]``
  with a parallel schedule (TVM's thread pool), for this host's CPU: the served
  throughput benchmark's kernel (tfbridge.BenchmarkServed).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import tvm
import tvm_ffi.cpp
from tvm import te

from dtypes import TVM_DTYPES



def _func(name: str, args: list[te.Tensor]) -> "tvm.tirx.PrimFunc":
    return te.create_prim_func(args).with_attr("global_symbol", name)


def test_functions() -> dict[str, tvm.tir.PrimFunc]:
    """Every function the Go and Python tests use, by exported name."""
    funcs = {}
    n = te.var("n")
    m = te.var("m")

    # add_one(x: float32[n]) -> float32[n]
    a = te.placeholder((n,), name="a", dtype="float32")
    funcs["add_one"] = _func("add_one", [a, te.compute((n,), lambda i: a[i] + 1.0, name="out")])

    # vector_add(a, b: float32[n]) -> float32[n]
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.placeholder((n,), name="b", dtype="float32")
    funcs["vector_add"] = _func("vector_add", [a, b, te.compute((n,), lambda i: a[i] + b[i], name="out")])

    # sum9(x0..x8: float32[n]) -> float32[n] = sum of (k+1) * xk: checks the order.
    xs = [te.placeholder((n,), name=f"x{k}", dtype="float32") for k in range(9)]

    def weighted(i):
        total = xs[0][i]
        for k in range(1, 9):
            total = total + xs[k][i] * float(k + 1)
        return total

    funcs["sum9"] = _func("sum9", [*xs, te.compute((n,), weighted, name="out")])

    # scale_int(x: float32[n], k: int32[n], d: float64[n]) -> float64[n] = x * k + d
    x = te.placeholder((n,), name="x", dtype="float32")
    k = te.placeholder((n,), name="k", dtype="int32")
    d = te.placeholder((n,), name="d", dtype="float64")
    out = te.compute(
        (n,), lambda i: x[i].astype("float64") * k[i].astype("float64") + d[i], name="out"
    )
    funcs["scale_mixed"] = _func("scale_mixed", [x, k, d, out])

    # matrix_add_one(x: float32[m, n]) -> float32[m, n]
    x = te.placeholder((m, n), name="x", dtype="float32")
    funcs["matrix_add_one"] = _func(
        "matrix_add_one", [x, te.compute((m, n), lambda i, j: x[i, j] + 1.0, name="out")]
    )

    # transpose(x: float32[m, n]) -> float32[n, m]
    x = te.placeholder((m, n), name="x", dtype="float32")
    funcs["transpose"] = _func("transpose", [x, te.compute((n, m), lambda i, j: x[j, i], name="out")])

    # row_sum(x: float32[m, n]) -> float32[m]
    x = te.placeholder((m, n), name="x", dtype="float32")
    r = te.reduce_axis((0, n), name="r")
    funcs["row_sum"] = _func("row_sum", [x, te.compute((m,), lambda i: te.sum(x[i, r], axis=r), name="out")])

    # add_one_4(x: float32[4]) -> float32[4]: a fixed shape that TVM checks.
    x = te.placeholder((4,), name="x", dtype="float32")
    funcs["add_one_4"] = _func("add_one_4", [x, te.compute((4,), lambda i: x[i] + 1.0, name="out")])

    # add_one_i64(x: int64[n]) -> int64[n]
    x = te.placeholder((n,), name="x", dtype="int64")
    funcs["add_one_i64"] = _func(
        "add_one_i64", [x, te.compute((n,), lambda i: x[i] + tvm.tirx.const(1, "int64"), name="out")]
    )
    # two_outputs(x: float32[m, n]) -> (float32[m, n] = 2x, float64[m] = row sums)
    x = te.placeholder((m, n), name="x", dtype="float32")
    doubled = te.compute((m, n), lambda i, j: x[i, j] * 2.0, name="doubled")
    r = te.reduce_axis((0, n), name="r")
    sums = te.compute((m,), lambda i: te.sum(x[i, r].astype("float64"), axis=r), name="sums")
    funcs["two_outputs"] = _func("two_outputs", [x, doubled, sums])

    for dtype in TVM_DTYPES:
        name = f"inc_{dtype}"
        x = te.placeholder((n,), name="x", dtype=dtype)
        if dtype == "bool":
            y = te.compute((n,), lambda i: tvm.tirx.Not(x[i]), name="y")
        else:
            y = te.compute((n,), lambda i: x[i] + tvm.tirx.const(1, dtype), name="y")
        funcs[name] = _func(name, [x, y])
    return funcs


def build_ffi_library(out: Path) -> None:
    """ffi_funcs.cc, compiled against tvm-ffi's headers into ``out``."""
    source = (Path(__file__).with_name("ffi_funcs.cc")).read_text()
    with tempfile.TemporaryDirectory() as build_dir:
        built = tvm_ffi.cpp.build_inline("ffifuncs", cpp_sources=source, build_directory=build_dir)
        shutil.copy(built, out)


def build_cuda_library(out: Path) -> None:
    """add_one for target cuda, exported with ``export_library`` into ``out``: the
    GPU harness's add_one (tests/gpu/tvm_add_one.py), carrying CUDA source."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
    from tvm_add_one import write_export_library

    write_export_library(str(out))


#: The served benchmark's matmul size, and the tile the schedule gives each
#: parallel task: TILE_I rows by TILE_J columns, accumulated in registers.
MATMUL_SIZE, TILE_I, TILE_J = 512, 8, 16


def matmul() -> "tvm.tirx.PrimFunc":
    """c = a @ b, rows split across TVM's thread pool (``T.parallel``), each task
    computing 8x16 tiles of c in registers with the columns vectorised."""
    a = te.placeholder((MATMUL_SIZE, MATMUL_SIZE), name="a", dtype="float32")
    b = te.placeholder((MATMUL_SIZE, MATMUL_SIZE), name="b", dtype="float32")
    k = te.reduce_axis((0, MATMUL_SIZE), name="k")
    c = te.compute((MATMUL_SIZE, MATMUL_SIZE), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    block = sch.get_sblock("c")
    i, j, k = sch.get_loops(block)
    i_outer, i_inner = sch.split(i, [None, TILE_I])
    j_outer, j_inner = sch.split(j, [None, TILE_J])
    sch.reorder(i_outer, j_outer, k, i_inner, j_inner)
    tile = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(tile, j_outer)
    sch.parallel(i_outer)
    sch.unroll(i_inner)
    sch.vectorize(j_inner)
    sch.vectorize(sch.get_loops(tile)[-1])
    sch.decompose_reduction(block, k)
    return sch.mod["main"].with_attr("global_symbol", "matmul")


def build_matmul_library(out: Path) -> None:
    """matmul for this host's CPU (the library runs where it is built: a benchmark
    of TVM against TensorFlow's own kernels should not handicap either)."""
    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    tvm.compile(tvm.IRModule({"matmul": matmul()}), target=target).export_library(str(out))


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = tvm.compile(tvm.IRModule(test_functions()), target="llvm")
    lib.export_library(str(out / "testfuncs.so"))
    build_ffi_library(out / "ffifuncs.so")
    build_cuda_library(out / "cudafuncs.so")
    build_matmul_library(out / "matmul.so")


if __name__ == "__main__":
    main(sys.argv[1])
