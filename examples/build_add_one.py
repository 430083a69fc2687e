"""Compiles add_one(x: float32[n]) -> float32[n] with TVM and exports it.

    python build_add_one.py OUT.so

TVM's compiler runs in this process only; the TensorFlow side (demo.py) needs
nothing of TVM but its runtime.
"""

import sys

import tvm
from tvm import te

n = te.var("n")
x = te.placeholder((n,), name="x", dtype="float32")
y = te.compute((n,), lambda i: x[i] + 1.0, name="y")
add_one = te.create_prim_func([x, y]).with_attr("global_symbol", "add_one")
tvm.compile(tvm.IRModule({"add_one": add_one}), target="llvm").export_library(sys.argv[1])
