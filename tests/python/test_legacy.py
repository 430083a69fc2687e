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
    """A library of old TVM that embeds modules only the old runtime rebuilt (CUDA
    code, a graph executor): refused, as InvalidArgumentError, naming the blob."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the stand-in library (the op library's build needs one too)"
    (tmp_path / "old.c").write_text(
        "void* __TVMAPISetLastError = 0;\nconst char __tvm_dev_mblob[16] = {0};\nint f(void) { return 0; }\n"
    )
    lib = tmp_path / "old.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "old.c")], check=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"TVM <= 0\.21.*__tvm_dev_mblob"):
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
