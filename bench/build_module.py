"""Compiles the add-one function the benchmarks call and exports it.

    python bench/build_module.py OUT.so

Run in its own process (bench/run.py does): TVM's compiler carries its own LLVM,
which must stay out of the TensorFlow process that runs the benchmarks. The
function is the one of examples/build_add_one.py: add_one(x: float32[n]) ->
float32[n], TVM's destination-passing convention (the output is the second
argument), a plain serial loop.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tvm
from tvm import te


def build(out: Path) -> None:
    """Writes add_one(x: float32[n]) -> float32[n] to ``out``."""
    n = te.var("n")
    x = te.placeholder((n,), name="x", dtype="float32")
    y = te.compute((n,), lambda i: x[i] + 1.0, name="y")
    add_one = te.create_prim_func([x, y]).with_attr("global_symbol", "add_one")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.so")
    tvm.compile(tvm.IRModule({"add_one": add_one}), target="llvm").export_library(str(tmp))
    tmp.replace(out)  # atomic: a half-written library is never picked up


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_module.py OUT.so")
    build(Path(sys.argv[1]))
