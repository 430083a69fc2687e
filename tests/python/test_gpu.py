"""TVMDSOOp on a GPU, through TensorFlow. Runs only with a GPU build of
TensorFlow and a visible GPU (docs/gpu.md says how); skipped elsewhere. The GPU
path without TensorFlow is proven by `make test-gpu`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_op

def _why_no_gpu() -> str | None:
    """Why these tests cannot run here, or None when they can. pytest.ini's -rs
    lists the reason in every run's summary: with the pinned tensorflow-cpu they
    never run, and the summary says so."""
    if not tf.test.is_built_with_cuda():
        return f"TensorFlow {tf.__version__} here is a CPU-only build: needs a CUDA build of TensorFlow and a GPU (docs/gpu.md)"
    if not tf.config.list_physical_devices("GPU"):
        return "TensorFlow sees no GPU on this machine (docs/gpu.md)"
    return None


pytestmark = pytest.mark.skipif(_why_no_gpu() is not None, reason=str(_why_no_gpu()))

#: TVM's add_one for CUDA, built by `make build` (tests/gpu/tvm_add_one.py).
TVM_ADD_ONE = Path(__file__).resolve().parents[2] / "build" / "gpu" / "tvm_add_one.so"


@pytest.fixture(scope="module")
def cuda_lib() -> tf_op.Module:
    return tf_op.Module(TVM_ADD_ONE)


def test_values_on_the_gpu(cuda_lib: tf_op.Module) -> None:
    with tf.device("/GPU:0"):
        x = tf.random.uniform([1 << 20])
        y = cuda_lib.func("add_one")(x)
    assert "GPU" in y.device
    np.testing.assert_array_equal(y.numpy(), x.numpy() + 1)


def test_ordered_after_tf_work_on_the_stream(cuda_lib: tf_op.Module) -> None:
    """A long TF computation feeds the op; no synchronisation between them."""
    add_one = cuda_lib.func("add_one")

    @tf.function
    def f() -> tf.Tensor:
        with tf.device("/GPU:0"):
            x = tf.zeros([1 << 22])
            for _ in range(50):  # a chain of kernels on TF's stream
                x = tf.sqrt(x * x + 1.0)
            return add_one(x)

    np.testing.assert_allclose(f().numpy(), np.sqrt(50.0) + 1, rtol=1e-5)


def test_a_model_compiled_for_cuda_runs_on_the_gpu(tmp_path: Path) -> None:
    """tf_op.compile with a CUDA target: the Keras model's values, computed on the GPU."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)])
    fast = tf_op.compile(model, target="cuda", cache_dir=tmp_path)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    y = fast(x)
    assert "GPU" in y.device
    np.testing.assert_allclose(y.numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
