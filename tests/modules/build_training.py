"""Builds the TVM libraries the training tests differentiate through.

    python build_training.py OUT_DIR

Runs in its own process, as build_modules.py does: TVM's compiler and TensorFlow
each bring an LLVM. Writes, into OUT_DIR:

- ``dense.so`` (``tvm.compile`` of TIR functions, destination-passing):
  ``dense_{f32,f64}(x[n,k], w[k,m], b[m]) -> x @ w + b`` and their gradients
  ``dense_{f32,f64}_grad(x, w, b, y, dy) -> (dy @ w.T, x.T @ dy, sum(dy, 0))``;
  ``scale_int(x: f32[n], k: i32[n]) -> x * k`` and ``scale_int_grad(x, k, y, dy)
  -> dy * k`` (an integer input, which gets no gradient); ``int_double(k: i32[n])
  -> 2 * k``, integers only, with no gradient; ``two_outputs(x: f32[n]) -> (2 * x,
  3 * x)`` and ``two_outputs_grad(x, y1, y2, dy1, dy2) -> 2 * dy1 + 3 * dy2``.
- ``dense_grad.so``: ``dense_f32_grad`` alone, a gradient in another library.
- ``mlp_train.so``: a ``relax.frontend.nn`` MLP, ``forward(x: f32[batch,4], w1,
  b1, w2, b2) -> f32[batch,3]``, with ``forward_grad`` made by
  ``tf_op_tvm.add_gradient`` (``relax.transform.Gradient``); ``mlp_train.npz``
  holds seeded weights w1, b1, w2, b2 in nn's layout (weights ``[out, in]``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import te
from tvm.relax.frontend import nn

# tf_op_tvm, from this checkout (the TVM Python may be another venv's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from tf_op_tvm import add_gradient  # noqa: E402

from build_models import MLP  # noqa: E402  (beside this script)

MLP_SEED = 3


def _func(name: str, args: list[te.Tensor]) -> tvm.tir.PrimFunc:
    return te.create_prim_func(args).with_attr("global_symbol", name)


def dense(name: str, dtype: str) -> tvm.tir.PrimFunc:
    n, k, m = te.var("n"), te.var("k"), te.var("m")
    x = te.placeholder((n, k), name="x", dtype=dtype)
    w = te.placeholder((k, m), name="w", dtype=dtype)
    b = te.placeholder((m,), name="b", dtype=dtype)
    r = te.reduce_axis((0, k), name="r")
    mm = te.compute((n, m), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="mm")
    y = te.compute((n, m), lambda i, j: mm[i, j] + b[j], name="y")
    return _func(name, [x, w, b, y])


def dense_grad(name: str, dtype: str) -> tvm.tir.PrimFunc:
    """The contract: inputs (x, w, b), the output y (unused), the upstream dy; then
    the gradients of x, w and b, which TF allocates."""
    n, k, m = te.var("n"), te.var("k"), te.var("m")
    x = te.placeholder((n, k), name="x", dtype=dtype)
    w = te.placeholder((k, m), name="w", dtype=dtype)
    b = te.placeholder((m,), name="b", dtype=dtype)
    y = te.placeholder((n, m), name="y", dtype=dtype)
    dy = te.placeholder((n, m), name="dy", dtype=dtype)
    rj = te.reduce_axis((0, m), name="rj")
    gx = te.compute((n, k), lambda i, q: te.sum(dy[i, rj] * w[q, rj], axis=rj), name="gx")
    ri = te.reduce_axis((0, n), name="ri")
    gw = te.compute((k, m), lambda q, j: te.sum(x[ri, q] * dy[ri, j], axis=ri), name="gw")
    rb = te.reduce_axis((0, n), name="rb")
    gb = te.compute((m,), lambda j: te.sum(dy[rb, j], axis=rb), name="gb")
    return _func(name, [x, w, b, y, dy, gx, gw, gb])


def small_functions() -> dict[str, tvm.tir.PrimFunc]:
    n = te.var("n")
    x = te.placeholder((n,), name="x", dtype="float32")
    k = te.placeholder((n,), name="k", dtype="int32")
    y = te.compute((n,), lambda i: x[i] * k[i].astype("float32"), name="y")
    forward = _func("scale_int", [x, k, y])
    x = te.placeholder((n,), name="x", dtype="float32")
    k = te.placeholder((n,), name="k", dtype="int32")
    y = te.placeholder((n,), name="y", dtype="float32")
    dy = te.placeholder((n,), name="dy", dtype="float32")
    gx = te.compute((n,), lambda i: dy[i] * k[i].astype("float32"), name="gx")
    x = te.placeholder((n,), name="x", dtype="float32")
    twice = te.compute((n,), lambda i: x[i] * 2.0, name="twice")
    thrice = te.compute((n,), lambda i: x[i] * 3.0, name="thrice")
    two_outputs = _func("two_outputs", [x, twice, thrice])
    x, y1, y2, dy1, dy2 = (te.placeholder((n,), name=v, dtype="float32") for v in ("x", "y1", "y2", "dy1", "dy2"))
    gx2 = te.compute((n,), lambda i: dy1[i] * 2.0 + dy2[i] * 3.0, name="gx")
    two_outputs_grad = _func("two_outputs_grad", [x, y1, y2, dy1, dy2, gx2])
    k2 = te.placeholder((n,), name="k", dtype="int32")
    doubled = te.compute((n,), lambda i: k2[i] * 2, name="doubled")
    return {
        "scale_int": forward,
        "scale_int_grad": _func("scale_int_grad", [x, k, y, dy, gx]),
        "int_double": _func("int_double", [k2, doubled]),
        "two_outputs": two_outputs,
        "two_outputs_grad": two_outputs_grad,
    }


def build_mlp(out_dir: Path) -> None:
    mod, params = MLP(4, 8, 3).export_tvm(spec={"forward": {"x": nn.spec.Tensor(["batch", 4], "float32")}})
    mod = add_gradient(mod, "forward")
    tvm.compile(mod, target="llvm").export_library(str(out_dir / "mlp_train.so"))
    rng = np.random.default_rng(MLP_SEED)
    names = ["w1", "b1", "w2", "b2"]
    values = {n: (rng.standard_normal([int(d) for d in p.shape]) * 0.5).astype("float32") for n, (_, p) in zip(names, params)}
    np.savez(out_dir / "mlp_train.npz", **values)


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    funcs = {
        "dense_f32": dense("dense_f32", "float32"),
        "dense_f32_grad": dense_grad("dense_f32_grad", "float32"),
        "dense_f64": dense("dense_f64", "float64"),
        "dense_f64_grad": dense_grad("dense_f64_grad", "float64"),
        **small_functions(),
    }
    tvm.compile(tvm.IRModule(funcs), target="llvm").export_library(str(out / "dense.so"))
    tvm.compile(tvm.IRModule({"dense_f32_grad": funcs["dense_f32_grad"]}), target="llvm").export_library(
        str(out / "dense_grad.so"))
    build_mlp(out)


if __name__ == "__main__":
    main(sys.argv[1])
