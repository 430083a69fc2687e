"""Libraries built by TVM 0.8-0.20 (the legacy ABI), run unchanged through tf_op
and through graphs of the old TvmDsoOp. The libraries were built by TVM 0.18
(tests/legacy/build_fixtures.sh) and are committed with their digests."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_op
from helpers import ffi_only_library_path, legacy_graph, run_in_threads, run_python

FIXTURES = Path(__file__).resolve().parents[1] / "legacy" / "fixtures"

#: SHA256SUMS as {file name: digest}: every library is opened pinned to it.
DIGESTS: dict[str, str] = {
    name: digest
    for digest, name in (line.split() for line in (FIXTURES / "SHA256SUMS").read_text().splitlines())
}


def legacy(name: str = "legacy.so") -> tf_op.Module:
    return tf_op.Module(FIXTURES / name, sha256=DIGESTS[name])


RNG = np.random.default_rng(18)
A = RNG.standard_normal((37, 11)).astype(np.float32)
V = RNG.standard_normal(1000).astype(np.float32)


@pytest.mark.parametrize(
    ("lib", "name", "inputs", "output_shape", "output_dtype", "expected"),
    [
        ("legacy.so", "add_one", [V], None, None, lambda v: v + 1),
        ("add_one.so", "add_one", [V], None, None, lambda v: v + 1),
        ("legacy.so", "row_sum", [A], [37], None, lambda a: a.sum(axis=1)),
        ("legacy.so", "scale_parallel", [A], None, None, lambda a: a * 3 + np.arange(37, dtype=np.float32)[:, None]),
        ("legacy.so", "two_stage", [V], None, None, lambda v: (v * v)[::-1] + 2),
        ("legacy.so", "add_pair", [V, V[::-1].copy()], None, None, lambda a, b: a + b),
        ("legacy.so", "cast_int", [np.arange(-5, 5, dtype=np.int32)], None, "float64", lambda a: a * 0.5),
        ("legacy.so", "is_positive", [V], None, "bool", lambda v: v > 0),
        ("legacy.so", "mask_select", [V > 0.5, V], None, "float32", lambda m, v: np.where(m, v, 0)),
    ],
    ids=["elementwise", "one-function tvm.build", "reduction", "parallel loop", "workspace memory", "two inputs",
         "int32 to float64", "bool output", "bool input"],
)
def test_functions_match_numpy(lib: str, name: str, inputs: list[np.ndarray], output_shape, output_dtype,
                               expected: Callable[..., np.ndarray]) -> None:
    fn = legacy(lib).func(name, output_shape=output_shape, output_dtype=output_dtype)
    out = fn(*[tf.constant(x) for x in inputs]).numpy()
    np.testing.assert_allclose(out, expected(*inputs), rtol=1e-5, atol=1e-6)


def test_functions_in_a_tf_function_with_dynamic_shapes() -> None:
    mod = legacy()
    scale = mod.func("scale_parallel")

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(a: tf.Tensor) -> tf.Tensor:
        return mod.func("row_sum", output_shape=[tf.shape(a)[0]])(scale(a))

    for shape in [(1, 1), (5, 3), (64, 129)]:
        a = RNG.standard_normal(shape).astype(np.float32)
        expected = (a * 3 + np.arange(shape[0], dtype=np.float32)[:, None]).sum(axis=1)
        np.testing.assert_allclose(f(a).numpy(), expected, rtol=1e-5)


def test_parallel_function_from_many_threads() -> None:
    """The parallel loop runs on TVM's thread pool, reached from TF's threads at once."""
    scale = legacy().func("scale_parallel")

    def worker(k: int) -> None:
        for _ in range(20):
            a = A + k
            np.testing.assert_allclose(scale(tf.constant(a)).numpy(), a * 3 + np.arange(37, dtype=np.float32)[:, None],
                                       rtol=1e-5, atol=1e-6)

    run_in_threads(worker, 8)


def test_shape_mismatch_is_a_tf_error_with_the_functions_message() -> None:
    add_pair = legacy().func("add_pair")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"add_pair.*add_pair\.b\.shape\[0\] has an unsatisfied"):
        add_pair(tf.constant(V), tf.constant(V[:3]))
    # The process and the library live on.
    np.testing.assert_array_equal(add_pair(tf.constant([1.0]), tf.constant([2.0])).numpy(), [3.0])


def test_packed_function_of_the_environment_is_unimplemented() -> None:
    with pytest.raises(tf.errors.UnimplementedError, match=r"packed function 'tvmdsoop\.legacy_test\.extern'"):
        legacy().func("extern_call")(tf.constant(V))


def test_only_the_librarys_own_functions() -> None:
    with pytest.raises(tf.errors.NotFoundError, match="malloc"):
        legacy().func("malloc")(tf.constant(V))


def run_graph(graph_def: tf.compat.v1.GraphDef, feed: dict[str, np.ndarray]) -> np.ndarray:
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run("tvm:0", feed_dict=feed)


@pytest.mark.parametrize(
    ("lib", "name", "shape_input", "static_shape", "inputs", "output_dtype", "expected"),
    [
        ("add_one.so", "add_one", np.int64(0), None, {"x": V}, tf.float32, lambda x: x + 1),
        ("legacy.so", "row_sum", np.array([37]), None, {"x": A}, tf.float32, lambda x: x.sum(axis=1)),
        ("legacy.so", "row_sum", np.int64(0), [37], {"x": A}, tf.float32, lambda x: x.sum(axis=1)),
        ("legacy.so", "scale_parallel", np.int64(0), None, {"x": A}, tf.float32,
         lambda x: x * 3 + np.arange(37, dtype=np.float32)[:, None]),
        ("legacy.so", "two_stage", np.int64(0), None, {"x": V}, tf.float32, lambda x: (x * x)[::-1] + 2),
        ("legacy.so", "add_pair", np.int64(0), None, {"x": V, "y": -V}, tf.float32, lambda x, y: x + y),
        ("legacy.so", "cast_int", np.int64(0), None, {"x": np.arange(7, dtype=np.int32)}, tf.float64,
         lambda x: x * 0.5),
    ],
    ids=["one-function library", "dynamic shape tensor", "static shape attr", "parallel loop", "workspace memory",
         "two inputs", "int32 to float64"],
)
def test_old_tvmdsoop_graphdef_runs_old_library(lib, name, shape_input, static_shape, inputs, output_dtype,
                                                 expected) -> None:
    graph = legacy_graph(str(FIXTURES / lib), name, shape_input, static_shape,
                         inputs=[(k, tf.as_dtype(v.dtype)) for k, v in inputs.items()], output_dtype=output_dtype)
    out = run_graph(graph, {f"{k}:0": v for k, v in inputs.items()})
    np.testing.assert_allclose(out, expected(*inputs.values()), rtol=1e-5, atol=1e-6)


def test_old_tvmdsoop_graphdef_error_is_a_tf_error() -> None:
    graph = legacy_graph(str(FIXTURES / "legacy.so"), "add_pair", np.int64(0), None,
                         inputs=[("x", tf.float32), ("y", tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"add_pair\.b\.shape\[0\] has an unsatisfied"):
        run_graph(graph, {"x:0": V, "y:0": V[:5]})


def test_library_embedding_old_modules_is_refused_before_it_runs(tmp_path: Path) -> None:
    """A library of old TVM that embeds a module only the old runtime rebuilt
    (CUDA code): refused, as UnimplementedError, naming what it holds."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the stand-in library (the op library's build needs one too)"
    # __tvm_dev_mblob: <nbytes> <1 module> <"cuda"> (its bytes are never reached)
    (tmp_path / "old.c").write_text(
        "void* __TVMAPISetLastError = 0;\n"
        "const unsigned char __tvm_dev_mblob[28] = {20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,\n"
        "  4, 0, 0, 0, 0, 0, 0, 0, 'c', 'u', 'd', 'a'};\nint f(void) { return 0; }\n"
    )
    lib = tmp_path / "old.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "old.c")], check=True)
    with pytest.raises(tf.errors.UnimplementedError, match=r'TVM <= 0\.21.*a module of kind "cuda"'):
        tf_op.Module(lib).func("f")(tf.constant(V))


CALL_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import tf_op

    try:
        out = tf_op.Module(sys.argv[1]).func("add_one")(tf.constant([1.0]))
        print("OK", out.numpy().tolist())
    except tf.errors.OpError as e:
        print(type(e).__name__, e.message)
    """
)


@pytest.mark.parametrize(
    ("lib", "expected"),
    [
        ("add_one.so", "OK [2.0]"),
        ("legacy.so", "FailedPreconditionError"),
    ],
    ids=["errors only: TVM-FFI is enough", "workspace and parallel loops need libtvm_runtime.so"],
)
def test_without_tvms_runtime(lib: str, expected: str) -> None:
    """With only libtvm_ffi.so on the search path (apache-tvm-ffi without apache-tvm)."""
    result = run_python(CALL_SCRIPT, str(FIXTURES / lib), env={"TVMDSOOP_LIBRARY_PATH": ffi_only_library_path()})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected), result.stdout
    if expected.endswith("Error"):
        assert "libtvm_runtime.so" in result.stdout and "TVMBackend" in result.stdout, result.stdout


# --- graph-executor models of relay.build ----------------------------------------------

_MASK = (1 << 64) - 1


def legacy_values(name: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """tests/legacy/fixtures.py's generator, which made the reference outputs:
    element i of the tensor named name is uniform in [-scale, scale) from
    splitmix64(fnv1a64(name) + i)."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & _MASK
    with np.errstate(over="ignore"):
        z = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(h) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return ((u * 2 - 1) * scale).astype(np.float32).reshape(shape)


def param_blob(params: dict[str, np.ndarray]) -> bytes:
    """float32 params as relay.save_param_dict writes them (SaveParams, SaveDLTensor)."""
    u64 = lambda v: int(v).to_bytes(8, "little")  # noqa: E731
    out = [u64(0xF7E58D4F05049CB7), u64(0), u64(len(params))]
    out += [u64(len(n.encode())) + n.encode() for n in params]
    out.append(u64(len(params)))
    for a in params.values():
        out += [u64(0xDD5E40F096B4A13F), u64(0), (1).to_bytes(4, "little"), (0).to_bytes(4, "little"),
                a.ndim.to_bytes(4, "little"), bytes([2, 32, 1, 0]), np.asarray(a.shape, "<i8").tobytes(),
                u64(a.nbytes), a.astype("<f4").tobytes()]
    return b"".join(out)


def mobilenet_params(graph_json: Path) -> dict[str, np.ndarray]:
    """MobileNet's params as fixtures.py generated them (not committed: 17 MB)."""
    import json

    graph = json.loads(graph_json.read_text())
    shapes = graph["attrs"]["shape"][1]
    params = {}
    for nid in graph["arg_nodes"]:
        name = graph["nodes"][nid]["name"]
        if name != "data":
            shape = tuple(shapes[graph["node_row_ptr"][nid]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            params[name] = legacy_values(name, shape, float(np.sqrt(3.0 / fan_in)) if fan_in > 1 else 0.1)
    return params


def reference(model: str) -> list[np.ndarray]:
    """TVM 0.18's graph executor's outputs of the fixture model on the generated data."""
    return [np.fromfile(p, "<f4") for p in sorted(FIXTURES.glob(f"{model}.out*"))]


def convnet_one_file() -> tf_op.Module:
    return legacy("convnet.so")


def convnet_three_files() -> tf_op.Module:
    return tf_op.Module(FIXTURES / "convnet_lib.so", sha256=DIGESTS["convnet_lib.so"],
                        graph_json=FIXTURES / "convnet.json", params=FIXTURES / "convnet.params")


CONVNET_DATA = legacy_values("data", (1, 3, 16, 16), 1.0)
CONVNET_OUTPUTS = {"output_shapes": [[1, 10], [1, 8]], "output_dtypes": [tf.float32, tf.float32]}


@pytest.mark.parametrize("make", [convnet_one_file, convnet_three_files], ids=["one file", "three files"])
def test_graph_model_matches_tvm_eager_and_in_tf_function(make: Callable[[], tf_op.Module]) -> None:
    module = make()
    assert module.is_model
    assert module.functions() == ["default"]
    net = module.func("default", **CONVNET_OUTPUTS)
    want = reference("convnet")
    for got in (net(tf.constant(CONVNET_DATA)), tf.function(net)(tf.constant(CONVNET_DATA))):
        assert [o.shape for o in got] == [(1, 10), (1, 8)]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy().ravel(), w, rtol=1e-4, atol=1e-5)


def test_mobilenet_three_files_matches_tvm(tmp_path: Path) -> None:
    (tmp_path / "mobilenet.params").write_bytes(param_blob(mobilenet_params(FIXTURES / "mobilenet.json")))
    module = tf_op.Module(FIXTURES / "mobilenet_lib.so", sha256=DIGESTS["mobilenet_lib.so"],
                          graph_json=FIXTURES / "mobilenet.json", params=tmp_path / "mobilenet.params")
    net = module.func("default", output_shape=[1, 1000])
    logits = net(tf.constant(legacy_values("data", (1, 3, 224, 224), 1.0)))
    np.testing.assert_allclose(logits.numpy().ravel(), reference("mobilenet")[0], rtol=1e-4, atol=1e-6)


def test_graph_model_in_a_tf1_session() -> None:
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [1, 3, 16, 16])
        logits, _ = convnet_three_files().func("default", **CONVNET_OUTPUTS)(x)
        with tf.compat.v1.Session(graph=g) as sess:
            out = sess.run(logits, {x: CONVNET_DATA})
    np.testing.assert_allclose(out.ravel(), reference("convnet")[0], rtol=1e-4, atol=1e-5)


def test_graph_model_savedmodel_carries_its_files(tmp_path: Path) -> None:
    work = tmp_path / "files"
    work.mkdir()
    for name in ("convnet_lib.so", "convnet.json", "convnet.params", "convnet.so"):
        shutil.copy(FIXTURES / name, work / name)
    root = tf.Module()
    root.three = tf_op.Module(work / "convnet_lib.so", graph_json=work / "convnet.json", params=work / "convnet.params")
    root.one = tf_op.Module(work / "convnet.so")
    spec = tf.TensorSpec([1, 3, 16, 16], tf.float32)
    three, one = root.three.func("default", **CONVNET_OUTPUTS), root.one.func("default", **CONVNET_OUTPUTS)
    root.f = tf.function(lambda x: (three(x)[0], one(x)[0]), input_signature=[spec])
    tf.saved_model.save(root, str(tmp_path / "saved"))
    shutil.rmtree(work)  # the loaded model runs from its own assets
    a, b = tf.saved_model.load(str(tmp_path / "saved")).f(tf.constant(CONVNET_DATA))
    for out in (a, b):
        np.testing.assert_allclose(out.numpy().ravel(), reference("convnet")[0], rtol=1e-4, atol=1e-5)


def test_graph_model_concurrent_calls() -> None:
    net = convnet_one_file().func("default", **CONVNET_OUTPUTS)
    inputs = [CONVNET_DATA * (i % 3) for i in range(12)]
    expected = [net(tf.constant(x))[0].numpy() for x in inputs[:3]]
    results: list[np.ndarray | None] = [None] * len(inputs)

    def call(i: int) -> None:
        for _ in range(10):
            results[i] = net(tf.constant(inputs[i]))[0].numpy()

    run_in_threads(call, len(inputs))
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, expected[i % 3])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (np.zeros((3, 16, 16), np.float32), r"input 'data' must have shape \[1, 3, 16, 16\], got \[3, 16, 16\]"),
        (np.zeros((1, 3, 16, 16), np.int32), r"input 'data' must be float32, got int32"),
    ],
    ids=["shape", "dtype"],
)
def test_graph_model_wrong_input_is_invalid_argument(data: np.ndarray, match: str) -> None:
    net = convnet_one_file().func("default", **CONVNET_OUTPUTS)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        net(tf.constant(data))


@pytest.mark.parametrize(
    ("graph", "params", "match"),
    [
        (lambda g: g[: len(g) // 2], lambda p: p, "graph JSON"),
        (lambda g: g.replace(b'"list_int", \n      [\n        1, ', b'"list_int", \n      [\n        2, ', 1), lambda p: p,
         "CPU only"),
        (lambda g: g, lambda p: p[:-5], "params"),
    ],
    ids=["truncated JSON", "CUDA graph", "truncated params"],
)
def test_graph_model_corrupted_files_are_clean_errors(tmp_path: Path, graph, params, match: str) -> None:
    (tmp_path / "g.json").write_bytes(graph((FIXTURES / "convnet.json").read_bytes()))
    (tmp_path / "p.params").write_bytes(params((FIXTURES / "convnet.params").read_bytes()))
    module = tf_op.Module(FIXTURES / "convnet_lib.so", sha256=DIGESTS["convnet_lib.so"],
                          graph_json=tmp_path / "g.json", params=tmp_path / "p.params")
    with pytest.raises(tf.errors.OpError, match=match):
        module.func("default", **CONVNET_OUTPUTS)(tf.constant(CONVNET_DATA))


def test_import_module_library_runs_its_functions() -> None:
    module = legacy("imported.so")
    assert not module.is_model
    np.testing.assert_allclose(module.func("add_one")(tf.constant(V)).numpy(), V + 1, rtol=1e-6)
    np.testing.assert_allclose(module.func("row_sum", output_shape=[37])(tf.constant(A)).numpy(), A.sum(axis=1),
                               rtol=1e-5, atol=1e-5)


def test_one_file_graph_model_as_a_keras_layer() -> None:
    layer = tf_op.ModelLayer(FIXTURES / "convnet.so", "default", output_shapes=[[1, 10], [1, 8]])
    logits, _ = layer(tf.constant(CONVNET_DATA))
    np.testing.assert_allclose(logits.numpy().ravel(), reference("convnet")[0], rtol=1e-4, atol=1e-5)
