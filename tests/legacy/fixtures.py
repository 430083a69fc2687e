"""Builds the legacy-ABI test libraries with an old TVM (0.18): run by
build_fixtures.sh, which puts that TVM on PYTHONPATH. Never imported by the tests.

    python fixtures.py OUTDIR

legacy.so holds one function per thing a legacy library asks of the runtime that
loads it (see tests/legacy/README.md); add_one.so is the single-function library
that `tvm.build(s, [A, B], "llvm", name=...)` gives, the common case of the old op.
"""

import sys
from pathlib import Path

import tvm
from tvm import te

assert tvm.__version__.startswith("0.18"), f"expected TVM 0.18, got {tvm.__version__} from {tvm.__file__}"


def add_one() -> tuple[te.Schedule, list[te.Tensor]]:
    """Elementwise, of any length."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="b")
    return te.create_schedule(b.op), [a, b]


def row_sum() -> tuple[te.Schedule, list[te.Tensor]]:
    """A reduction: the sums of the rows of an n x m matrix."""
    n, m = te.var("n"), te.var("m")
    a = te.placeholder((n, m), name="a", dtype="float32")
    k = te.reduce_axis((0, m), name="k")
    b = te.compute((n,), lambda i: te.sum(a[i, k], axis=k), name="b")
    return te.create_schedule(b.op), [a, b]


def scale_parallel() -> tuple[te.Schedule, list[te.Tensor]]:
    """A parallel loop over the rows: calls __TVMBackendParallelLaunch."""
    n, m = te.var("n"), te.var("m")
    a = te.placeholder((n, m), name="a", dtype="float32")
    b = te.compute((n, m), lambda i, j: a[i, j] * 3.0 + i.astype("float32"), name="b")
    s = te.create_schedule(b.op)
    s[b].parallel(b.op.axis[0])
    return s, [a, b]


def two_stage() -> tuple[te.Schedule, list[te.Tensor]]:
    """An intermediate of the input's (dynamic) size, kept as its own stage: it
    lives in workspace memory (__TVMBackendAllocWorkspace / FreeWorkspace)."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="float32")
    t = te.compute((n,), lambda i: a[i] * a[i], name="t")
    b = te.compute((n,), lambda i: t[n - 1 - i] + 2.0, name="b")
    return te.create_schedule(b.op), [a, b]


def add_pair() -> tuple[te.Schedule, list[te.Tensor]]:
    """Two inputs that must have one length: the function checks it, and reports a
    mismatch through __TVMAPISetLastError."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.placeholder((n,), name="b", dtype="float32")
    c = te.compute((n,), lambda i: a[i] + b[i], name="c")
    return te.create_schedule(c.op), [a, b, c]


def cast_int() -> tuple[te.Schedule, list[te.Tensor]]:
    """int32 in, float64 out: dtypes other than float32 pass through."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="int32")
    b = te.compute((n,), lambda i: a[i].astype("float64") * 0.5, name="b")
    return te.create_schedule(b.op), [a, b]


def is_positive() -> tuple[te.Schedule, list[te.Tensor]]:
    """A bool output: old TVM's bool is uint1 (one byte a value), TF's DLPack bool."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.compute((n,), lambda i: a[i] > 0.0, name="b")
    return te.create_schedule(b.op), [a, b]


def mask_select() -> tuple[te.Schedule, list[te.Tensor]]:
    """A bool input: a where mask, else 0."""
    n = te.var("n")
    mask = te.placeholder((n,), name="mask", dtype="bool")
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.compute((n,), lambda i: tvm.tir.Select(mask[i], a[i], tvm.tir.const(0.0, "float32")), name="b")
    return te.create_schedule(b.op), [mask, a, b]


def extern_call() -> tuple[te.Schedule, list[te.Tensor]]:
    """Calls a packed function of its runtime, as extern calls (cblas, ...) do:
    through __TVMBackendGetFuncFromEnv with __tvm_module_ctx, then __TVMFuncCall."""
    n = te.var("n")
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.extern(
        (n,), [a], lambda ins, outs: tvm.tir.call_packed("tvmdsoop.legacy_test.extern", ins[0], outs[0]),
        name="b", dtype="float32",
    )
    return te.create_schedule(b.op), [a, b]


LEGACY_FUNCTIONS = [add_one, row_sum, scale_parallel, two_stage, add_pair, cast_int, is_positive, mask_select, extern_call]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    mod = tvm.IRModule({})
    for make in LEGACY_FUNCTIONS:
        s, args = make()
        mod.update(tvm.lower(s, args, name=make.__name__))
    tvm.build(mod, target="llvm").export_library(str(out / "legacy.so"))
    s, args = add_one()
    tvm.build(s, args, "llvm", name="add_one").export_library(str(out / "add_one.so"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
