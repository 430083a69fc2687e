"""Builds the legacy-ABI test libraries with an old TVM (0.18): run by
build_fixtures.sh, which puts that TVM on PYTHONPATH. Never imported by the tests.

    python fixtures.py OUTDIR

legacy.so holds one function per thing a legacy library asks of the runtime that
loads it (see tests/legacy/README.md); add_one.so is the single-function library
that `tvm.build(s, [A, B], "llvm", name=...)` gives, the common case of the old op.
imported.so is a library with an imported module (import_module). The graph
executor models of relay.build are a small conv net in both of their forms, and
MobileNet as three files without its params (see legacy_params), with the
outputs of TVM 0.18's own graph executor as references.
"""

import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relay, te
from tvm.contrib import graph_executor
from tvm.relay import testing

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


def imported() -> tvm.runtime.Module:
    """A library that imports another (import_module): both are CPU code, which
    export_library links into one library, whose __tvm_dev_mblob then holds only
    the import tree (_lib, _import_tree)."""
    s, args = add_one()
    lib = tvm.build(s, args, "llvm", name="add_one")
    s, args = row_sum()
    lib.import_module(tvm.build(s, args, "llvm", name="row_sum"))
    return lib


# The generator of the values of graph models' inputs and params, which the
# tests reproduce in Go and in Python (legacy_graph_test.go, test_legacy.py)
# rather than commit MobileNet's 17 MB of params: element i of the tensor named
# name is uniform in [-scale, scale) from splitmix64(fnv1a64(name) + i).
_MASK = (1 << 64) - 1


def fnv1a64(name: str) -> int:
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & _MASK
    return h


def legacy_values(name: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(fnv1a64(name))
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return ((u * 2 - 1) * scale).astype(np.float32).reshape(shape)


def legacy_scale(shape: tuple[int, ...]) -> float:
    """Weights (more than one input feature an output) scaled by their fan-in, so
    that activations keep their size through MobileNet's layers; biases small."""
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return float(np.sqrt(3.0 / fan_in)) if fan_in > 1 else 0.1


def legacy_params(graph_json: str) -> dict[str, np.ndarray]:
    """The generated params of a graph: every input but "data"."""
    import json

    graph = json.loads(graph_json)
    shapes = graph["attrs"]["shape"][1]
    params = {}
    for nid in graph["arg_nodes"]:
        name = graph["nodes"][nid]["name"]
        if name != "data":
            shape = tuple(shapes[graph["node_row_ptr"][nid]])
            params[name] = legacy_values(name, shape, legacy_scale(shape))
    return params


def convnet() -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Two convolutions, a pool and a dense layer, with two outputs: the logits
    and the pooled features."""
    data = relay.var("data", shape=(1, 3, 16, 16), dtype="float32")
    w1 = relay.var("w1", shape=(8, 3, 3, 3))
    w2 = relay.var("w2", shape=(8, 8, 3, 3))
    b2 = relay.var("b2", shape=(8,))
    wd = relay.var("wd", shape=(10, 8))
    x = relay.nn.relu(relay.nn.conv2d(data, w1, padding=(1, 1), channels=8, kernel_size=(3, 3)))
    x = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w2, padding=(1, 1), channels=8, kernel_size=(3, 3)), b2))
    pooled = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(x))
    logits = relay.nn.dense(pooled, wd)
    func = relay.Function([data, w1, w2, b2, wd], relay.Tuple([logits, pooled]))
    params = {v.name_hint: legacy_values(v.name_hint, tuple(int(d) for d in v.type_annotation.shape), 0.5)
              for v in func.params[1:]}
    return tvm.IRModule.from_expr(func), params


def mobilenet() -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """relay.testing's MobileNet at batch 1, its params bound (batch norms folded)."""
    return testing.mobilenet.get_workload(batch_size=1)


def reference(lib: tvm.runtime.Module, out: Path, name: str, params: dict[str, np.ndarray]) -> None:
    """Runs TVM 0.18's graph executor on the generated "data" and params and
    writes each output, raw little-endian, as name.out<i>."""
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    shape, _ = m.get_input_info()
    data = legacy_values("data", tuple(int(d) for d in shape["data"]), 1.0)
    m.set_input("data", data, **params)
    m.run()
    for i in range(m.get_num_outputs()):
        o = m.get_output(i).numpy()
        assert np.isfinite(o).all() and o.std() > 0, f"{name} output {i} is degenerate"
        (out / f"{name}.out{i}").write_bytes(o.astype("<f4").tobytes())


def graph_model(out: Path, name: str, mod: tvm.IRModule, params: dict[str, np.ndarray], factory: bool) -> None:
    """relay.build's model as three files (name_lib.so, name.json, and
    name.params unless the params are generated) and, when factory, as one
    (name.so, the graph and params embedded)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm", params=params)
    graph_json = lib.get_graph_json()
    lib.get_lib().export_library(str(out / f"{name}_lib.so"))
    (out / f"{name}.json").write_text(graph_json)
    if factory:
        built = {k: v.numpy() for k, v in lib.get_params().items()}
        (out / f"{name}.params").write_bytes(relay.save_param_dict(lib.get_params()))
        lib.export_library(str(out / f"{name}.so"))
    else:
        built = legacy_params(graph_json)
    reference(lib, out, name, built)


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
    imported().export_library(str(out / "imported.so"))
    graph_model(out, "convnet", *convnet(), factory=True)
    graph_model(out, "mobilenet", *mobilenet(), factory=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
