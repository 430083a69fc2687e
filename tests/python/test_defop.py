"""defop: kernels written in Python with TVM (tests/modules/defops.py), built
ahead of time by ``python -m tf_op_tvm.build_ops`` in a process of its own, and
called as TF ops through ``tf_op.load_ops``, against NumPy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_op
from tf_op import defops
from conftest import MODULES_DIR, TVM_PYTHON
from helpers import run_python

REPO_PYTHON = MODULES_DIR.parent.parent / "python"
#: The defops make test-gpu runs on a GPU (tests/gpu/defop_harness.c).
GPU_DEFOPS = MODULES_DIR.parent / "gpu" / "defop_ops.py"


@pytest.fixture(scope="session")
def defops_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/modules/defops.py built into defops.so (and its defops.json)."""
    out = tmp_path_factory.mktemp("defops") / "defops.so"
    started = time.monotonic()
    subprocess.run(
        [TVM_PYTHON, "-m", "tf_op_tvm.build_ops", str(MODULES_DIR / "defops.py"), "-o", str(out)],
        check=True, env={**os.environ, "PYTHONPATH": str(REPO_PYTHON)},
    )
    print(f"build_ops: 7 defops, 20 variants in {time.monotonic() - started:.1f} s")
    return out


@pytest.fixture(scope="session")
def ops(defops_library: Path) -> tf_op.Ops:
    return tf_op.load_ops(defops_library)


def _random(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape).astype(np.int32)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_every_variant_equals_numpy(ops: tf_op.Ops, dtype: str, ndim: int) -> None:
    shape = (5, 4, 3)[:ndim]
    x, y = _random(shape, dtype, 1), _random(shape, dtype, 2)
    z = ops.vadd(x, y)
    assert z.dtype.name == dtype and z.shape == shape
    np.testing.assert_array_equal(z.numpy(), x + y)


def test_eager_calls_reuse_the_function_of_their_variant_and_shapes(ops: tf_op.Ops,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the op's Func (a tf.Module, and its checks) took several times the
    rest of an eager call: an op keeps the one of each variant and output
    shapes it was called with, and makes another for new shapes."""
    made: list[str] = []
    make = defops.Func
    monkeypatch.setattr(defops, "Func", lambda *a, **k: made.append(a[1]) or make(*a, **k))
    x, y, z = _random((9, 7), "float32", 5), _random((9, 7), "float32", 6), _random((2, 7), "float32", 7)
    for _ in range(3):
        np.testing.assert_array_equal(ops.vadd(x, y).numpy(), x + y)
    np.testing.assert_array_equal(ops.vadd(z, z).numpy(), z + z)
    np.testing.assert_array_equal(ops.vadd(y, x).numpy(), y + x)
    assert made == ["vadd_float32_2d", "vadd_float32_2d"]


@pytest.mark.parametrize(
    "a, b",
    [((2, 3), (3,)), ((4, 1, 3), (1, 5, 1)), ((1,), (7,)), ((), (2, 2)), ((3, 1), (1, 4))],
)
def test_broadcasting_like_numpy(ops: tf_op.Ops, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    x, y = _random(a, "float32", 3), _random(b, "float32", 4)
    np.testing.assert_array_equal(ops.vadd(x, y).numpy(), x + y)
    np.testing.assert_array_equal(ops.vadd(y, x).numpy(), y + x)


def test_broadcasting_in_a_traced_function(ops: tf_op.Ops) -> None:
    f = tf.function(ops.vadd, input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([None, None])])
    x, y = _random((4, 3), "float32", 5), _random((1, 1), "float32", 6)
    np.testing.assert_array_equal(f(x, y).numpy(), x + y)
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(x, _random((2, 3), "float32", 7))  # 4 and 2 do not broadcast: TF says so before the kernel


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_reduction_has_its_own_output_shape(ops: tf_op.Ops, dtype: str) -> None:
    x = _random((6, 9), dtype, 8)
    np.testing.assert_allclose(ops.row_sum(x).numpy(), x.sum(axis=1), rtol=1e-5)
    f = tf.function(ops.row_sum, input_signature=[tf.TensorSpec([None, None], dtype)])
    assert f.get_concrete_function().structured_outputs.shape.as_list() == [None]
    np.testing.assert_allclose(f(x).numpy(), x.sum(axis=1), rtol=1e-5)


def test_an_output_size_computed_from_the_inputs(ops: tf_op.Ops) -> None:
    a, b = _random((3,), "float32", 9), _random((5,), "float32", 10)
    assert ops.concat(a, b).shape == (8,)
    np.testing.assert_array_equal(ops.concat(a, b).numpy(), np.concatenate([a, b]))
    f = tf.function(ops.concat, input_signature=[tf.TensorSpec([3]), tf.TensorSpec([None])])
    np.testing.assert_array_equal(f(a, b).numpy(), np.concatenate([a, b]))


def test_fused_bias_swish(ops: tf_op.Ops) -> None:
    x, b = _random((64, 32), "float32", 11), _random((32,), "float32", 12)
    t = x + b
    np.testing.assert_allclose(ops.bias_swish(x, b).numpy(), t / (1 + np.exp(-t)), rtol=1e-5, atol=1e-6)


def test_gradient_from_another_defop(ops: tf_op.Ops) -> None:
    x = tf.constant(_random((4, 7), "float32", 13))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ops.swish(x)
        loss = tf.reduce_sum(y * y)
    with tf.GradientTape() as reference_tape:
        reference_tape.watch(x)
        reference = tf.reduce_sum(tf.nn.silu(x) ** 2)
    np.testing.assert_allclose(y.numpy(), tf.nn.silu(x).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), reference_tape.gradient(reference, x).numpy(),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda ops: ops.vadd(np.int64([1]), np.int64([2])),
         "op vadd has no int64 variant; it has float32, float64, int32"),
        (lambda ops: ops.vmul(np.ones((2, 2, 2), np.float32), np.ones((2, 2, 2), np.float32)),
         "op vmul has no float32 variant of 3 dimensions; its float32 variants have 1, 2 dimensions"),
        (lambda ops: ops.vmul(np.ones(3, np.float32), np.ones(2, np.float32)),
         "input 1 is read element by element into output 0, so it must have that output's shape [3], got [2]"),
        (lambda ops: ops.vmul(np.ones(3, np.float32), np.ones(3, np.float64)),
         "input 1 is float64, the variant takes float32"),
    ],
)
def test_bad_input_is_a_clear_error(ops: tf_op.Ops, call, message: str) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(ops)
    np.testing.assert_array_equal(ops.vmul(np.float32([2]), np.float32([3])).numpy(), [6])  # lives on


def test_a_smaller_input_is_refused_at_run_time_in_a_graph(ops: tf_op.Ops) -> None:
    """Shapes known only when the graph runs: the check runs before the kernel,
    which would otherwise read past the smaller input."""
    f = tf.function(ops.vmul, input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 1 is read element by element into output 0"):
        f(np.ones(1000, np.float32), np.ones(2, np.float32))
    np.testing.assert_array_equal(f(np.float32([2, 3]), np.float32([4, 5])).numpy(), [8, 15])


def test_unknown_op_names_those_it_has(ops: tf_op.Ops) -> None:
    with pytest.raises(AttributeError, match="vsub"):
        ops.vsub  # noqa: B018
    assert ops.names() == ["bias_swish", "concat", "row_sum", "swish", "swish_grad", "vadd", "vmul"]


def test_manifest_errors(defops_library: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib.so"
    shutil.copy(defops_library, lib)
    with pytest.raises(FileNotFoundError, match="no manifest"):
        tf_op.load_ops(lib)
    (tmp_path / "lib.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        tf_op.load_ops(lib)
    (tmp_path / "lib.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a defop manifest"):
        tf_op.load_ops(lib)


def test_a_library_rebuilt_without_its_manifest_is_refused(defops_library: Path, tmp_path: Path) -> None:
    lib = tmp_path / "defops.so"
    shutil.copy(defops_library, lib)
    shutil.copy(defops_library.with_suffix(".json"), tmp_path / "defops.json")
    with lib.open("ab") as f:
        f.write(b"\0")  # another library now: its digest is not the manifest's
    with pytest.raises(tf.errors.PermissionDeniedError, match="not the one the model was built with"):
        tf_op.load_ops(lib).vadd(np.float32([1]), np.float32([2]))


_LOAD_SAVED = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import tf_op
    model = tf.saved_model.load(sys.argv[1])
    print(model.f(tf.constant([[1.0, 2.0]]), tf.constant([10.0, 20.0])).numpy().tolist())
""")


def test_saved_model_carries_the_library(defops_library: Path, tmp_path: Path) -> None:
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    shutil.copy(defops_library, lib_dir / "defops.so")
    shutil.copy(defops_library.with_suffix(".json"), lib_dir / "defops.json")
    holder = tf.Module()
    holder.ops = tf_op.load_ops(lib_dir / "defops.so")
    holder.f = tf.function(lambda x, b: holder.ops.vadd(x, b),
                           input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([2])])
    tf.saved_model.save(holder, str(tmp_path / "model"))
    shutil.rmtree(lib_dir)
    done = run_python(_LOAD_SAVED, str(tmp_path / "model"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[[11.0, 22.0]]"


def test_in_a_keras_model(ops: tf_op.Ops) -> None:
    import keras

    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5), keras.layers.Lambda(ops.swish)])
    x = _random((3, 7), "float32", 14)
    dense = model.layers[0](x)
    np.testing.assert_allclose(model.predict(x, verbose=0), tf.nn.silu(dense).numpy(), rtol=1e-5, atol=1e-6)




def _build(source: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TVM_PYTHON, "-m", "tf_op_tvm.build_ops", str(source), "-o", str(out), *args], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_PYTHON), "TVM_COMPILE_FORCE_FALLBACK": "1"},
    )


def test_cuda_build_binds_threads(tmp_path: Path) -> None:
    """A cuda target gets the default GPU schedule (TVM refuses a kernel with a
    loop left unbound), and the manifest places the ops on the GPU. No GPU
    here: make test-gpu runs these defops (defop_harness)."""
    done = _build(GPU_DEFOPS, tmp_path / "ops.so", "--target", "cuda")
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((tmp_path / "ops.json").read_text())
    assert manifest["device"] == "cuda"
    assert [v["function"] for v in manifest["ops"]["swish_bias"]["variants"]] == ["swish_bias_float32_2d"]
    assert tf_op.load_ops(tmp_path / "ops.so").device == "/GPU:0"
    # Built without a GPU, the library carries its kernels' CUDA source: a row sum
    # is reduced across a warp (TVM's shuffles), a column sum across a block's
    # warps (shared memory), each in parts, not a whole row or column a thread.
    library = (tmp_path / "ops.so").read_bytes()
    assert "__shfl_down_sync" in _kernel_source(library, "row_sum_float32_2d")
    assert "__shared__" in _kernel_source(library, "col_sum_float32_2d")
    assert "threadIdx.y" not in _kernel_source(library, "vadd_float32_2d")


def _kernel_source(library: bytes, function: str) -> str:
    """The CUDA source of function's kernel, from a library that carries source."""
    head = f"void __launch_bounds__(256) {function}_kernel(".encode()
    start = library.find(head, library.find(head) + 1)  # its definition follows its declaration
    assert start > 0, f"no CUDA source of {function} in the library"
    return library[start:library.find(b"\n}\n", start)].decode()


def test_build_errors_name_the_op(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(textwrap.dedent("""
        from tvm import te
        from tf_op_tvm import defop

        @defop(name="square", dtypes=["float32"], ndims=[1])
        def square(dtype, ndim):
            X = te.placeholder([te.var() * 2], name="X", dtype=dtype)
            return [X, te.compute(X.shape, lambda i: X[i] * X[i], name="Y")]
    """))
    done = _build(tmp_path / "bad.py", tmp_path / "bad.so")
    assert done.returncode == 1
    assert "defop square (float32, 1 dimensions): input 0 (X) has size" in done.stderr
    assert "an input's sizes must be te.var() or integers" in done.stderr
