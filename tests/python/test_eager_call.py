"""Eager calls of functions that return their outputs, without TF's op dispatch
(tf_op._eager, kernels/eager_call.cc), and the calls that must stay the op's.

The other tests of returning functions and models (test_models.py: zero copy,
copies, checks of what comes back) run eagerly, through this path, too."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_in_threads

import tf_op
from tf_op import _eager


@pytest.fixture
def ffi(ffilib: str) -> tf_op.Module:
    return tf_op.Module(ffilib)


@pytest.fixture
def cnn(models_dir: Path) -> tf_op.module.Func:
    return tf_op.Module(models_dir / "cnn_b4.so").func("main", output_shape=[4, 10])


def _images(seed: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).standard_normal((4, 16, 16, 3)).astype(np.float32))


def test_an_eager_call_of_a_model_skips_the_op_with_the_ops_values(cnn: tf_op.module.Func,
                                                                   models_dir: Path) -> None:
    """The library's VM called from the op library's eager entry: Keras's
    values, and the op's (in a tf.function) to the bit."""
    x = _images(0)
    eager = cnn(x)
    assert isinstance(cnn._eager.call, _eager.EagerCall)
    in_graph = tf.function(cnn)(x)
    np.testing.assert_array_equal(eager.numpy(), in_graph.numpy())
    keras_cnn = keras.models.load_model(models_dir / "cnn.keras")
    np.testing.assert_allclose(eager.numpy(), keras_cnn(x.numpy()).numpy(), rtol=1e-5, atol=1e-5)


def test_eager_calls_from_threads_share_the_models_vms(cnn: tf_op.module.Func) -> None:
    inputs = [_images(k) for k in range(8)]
    want = [tf.function(cnn)(x).numpy() for x in inputs]

    def worker(k: int) -> None:
        for _ in range(20):
            np.testing.assert_array_equal(cnn(inputs[k]).numpy(), want[k])

    run_in_threads(worker, len(inputs))


def test_a_model_called_with_too_many_inputs_says_so_eagerly(cnn: tf_op.module.Func) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'main' of .*cnn_b4.so: the model's function takes 1 "
                                                             r"input\(s\), got 2"):
        cnn(_images(0), _images(1))
    assert cnn(_images(0)).shape == (4, 10)  # and the process lives on


def test_op_callbacks_see_the_op(ffi: tf_op.Module) -> None:
    """check_numerics watches every op's outputs through an op callback: with
    one registered, the call is the op's, and a NaN it returns is caught."""
    identity = ffi.func("identity", returns=True)
    nan = tf.constant([1.0, np.nan])
    np.testing.assert_array_equal(identity(nan).numpy(), [1.0, np.nan])  # the eager entry: no check
    tf.debugging.enable_check_numerics()
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="TVMDSOOp"):
            identity(nan)
    finally:
        tf.debugging.disable_check_numerics()


def test_a_tape_gets_the_op(ffi: tf_op.Module) -> None:
    """Under a tape the op runs, so that the tape records it: a function without
    grad= then has TF's error for an op without a gradient, not a silent None."""
    identity = ffi.func("identity", returns=True)
    x = tf.constant([1.0, 2.0, 3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(identity(x))
    with pytest.raises(LookupError, match=r"function 'identity'.* has no gradient"):
        tape.gradient(loss, x)


def test_functions_with_output_buffers_keep_the_op(testlib: str) -> None:
    """TF allocates the outputs of a function that writes into buffers: the op's."""
    add_one = tf_op.Module(testlib).func("add_one")
    np.testing.assert_array_equal(add_one(tf.constant([1.0, 2.0])).numpy(), [2.0, 3.0])
    assert add_one._eager.call is False


def test_the_entry_can_be_turned_off(ffi: tf_op.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """TVMDSOOP_EAGER_ENTRY=0: every eager call the op's (TF's profiler sees ops)."""
    monkeypatch.setenv("TVMDSOOP_EAGER_ENTRY", "0")
    identity = ffi.func("identity", returns=True)
    np.testing.assert_array_equal(identity(tf.constant([1.0, 2.0])).numpy(), [1.0, 2.0])
    assert identity._eager.call is False


def test_inputs_dlpack_cannot_lend_get_the_ops_error(ffi: tf_op.Module) -> None:
    identity = ffi.func("identity", returns=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has dtype string, which DLPack cannot describe"):
        identity(tf.constant(["a", "b"]))


@pytest.mark.parametrize(
    ("declared", "pattern"),
    [
        ({"output_dtype": tf.int32}, r"output 0 is float32, but the op declares int32"),
        ({"output_shape": [3]}, r"output 0 has shape \[2\], but the op declares \[3\]"),
        ({"output_shape": [2, 1]}, r"output 0 has shape \[2\], but the op declares \[2,1\]"),
        ({"output_shapes": [[None], [None]]}, r"returned 1 tensor\(s\), but the op declares 2 output"),
    ],
)
def test_the_entry_checks_what_comes_back_as_the_op_does(ffi: tf_op.Module, declared: dict, pattern: str) -> None:
    """What the function returns is checked against what is declared in the op
    library's entry (C++, the op's own check): the op's error, word for word."""
    identity = ffi.func("identity", returns=True, **declared)
    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"'identity' of .*: {pattern}") as eager:
        identity(x)
    assert isinstance(identity._eager.call, _eager.EagerCall)
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern) as op:
        tf.function(identity)(x)
    assert eager.value.message in op.value.message


@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, tf.uint8])
def test_outputs_of_the_first_inputs_dtype_pass_the_entrys_check(ffi: tf_op.Module, dtype: tf.DType) -> None:
    identity = ffi.func("identity", returns=True, output_shape=[None])
    x = tf.constant([1, 2, 3], dtype=dtype)
    got = identity(x)
    assert isinstance(identity._eager.call, _eager.EagerCall)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), [1, 2, 3])
