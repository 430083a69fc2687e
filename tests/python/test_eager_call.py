"""Eager calls of functions that return their outputs, without TF's op dispatch
(tf_op._eager, cmd/eager_entry/eager_entry.c, kernels/eager_call.cc), and the
calls that must stay the op's.

The other tests of returning functions and models (test_models.py: zero copy,
copies, checks of what comes back) run eagerly, through this path, too."""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_in_threads, run_python

import tf_op
from tf_op import _eager, _library


@pytest.fixture
def ffi(ffilib: str) -> tf_op.Module:
    return tf_op.Module(ffilib)


@pytest.fixture
def cnn(models_dir: Path) -> tf_op.module.Func:
    return tf_op.Module(models_dir / "cnn_b4.so").func("main", output_shape=[4, 10])


def _entry_of(func: tf_op.module.Func) -> str:
    """Where the eager calls of ``func`` went: the extension's module for its entry."""
    return type(func._eager.call).__module__


def _images(seed: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).standard_normal((4, 16, 16, 3)).astype(np.float32))


def test_an_eager_call_of_a_model_skips_the_op_with_the_ops_values(cnn: tf_op.module.Func,
                                                                   models_dir: Path) -> None:
    """The library's VM called from the op library's eager entry: Keras's
    values, and the op's (in a tf.function) to the bit."""
    x = _images(0)
    eager = cnn(x)
    assert _entry_of(cnn) == "tf_op._eager_entry"
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
    assert _entry_of(identity) == "tf_op._eager_entry"
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern) as op:
        tf.function(identity)(x)
    assert eager.value.message in op.value.message


@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, tf.uint8])
def test_outputs_of_the_first_inputs_dtype_pass_the_entrys_check(ffi: tf_op.Module, dtype: tf.DType) -> None:
    identity = ffi.func("identity", returns=True, output_shape=[None])
    x = tf.constant([1, 2, 3], dtype=dtype)
    got = identity(x)
    assert _entry_of(identity) == "tf_op._eager_entry"
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), [1, 2, 3])


def test_the_entry_refuses_what_is_not_a_sequence_of_tensors(ffi: tf_op.Module) -> None:
    """Its own callers pass lists or tuples of eager tensors; anything else is
    a Python error, not a crash, and the entry works on."""
    identity = ffi.func("identity", returns=True)
    x = tf.constant([1.0, 2.0])
    identity(x)
    call = identity._eager.call
    with pytest.raises(TypeError, match="not iterable"):
        call(5)
    with pytest.raises(AttributeError, match="_datatype_enum"):
        call([1.0])
    np.testing.assert_array_equal(call((x,))[0].numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(call([x])[0].numpy(), [1.0, 2.0])


def test_an_op_library_without_its_eager_entry_runs_the_op(ffilib: str, tmp_path: Path) -> None:
    """An op library with no _eager_entry.abi3.so beside it (built for a Python
    without its C headers, or by other means): eager calls are the op's, and a
    warning says why, naming the library."""
    built = _library.library_path().parent
    for name in (_library.LIBRARY_NAME, _library.BUILD_INFO_NAME, "tvmdsoop-probe"):
        shutil.copy2(built / name, tmp_path / name)
    script = (
        "import sys, tensorflow as tf, tf_op\n"
        "identity = tf_op.Module(sys.argv[1]).func('identity', returns=True)\n"
        "print(identity(tf.constant([1.0, 2.0])).numpy().tolist(), identity._eager.call)\n"
    )
    run = run_python(script, ffilib, env={_library.LIBRARY_ENV: str(tmp_path / _library.LIBRARY_NAME)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[1.0, 2.0] False"
    assert f"no eager entry beside the op library ({tmp_path / _library.LIBRARY_NAME})" in run.stderr


def test_a_compiled_functions_next_eager_calls_are_the_extensions(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a compiled function has called a shape eagerly through the entry
    (its first call compiles, its second runs the library), its eager calls of
    that shape are the extension's (call_compiled, in C): the same values, in
    the function's structure. A numpy input, another dtype, a new shape, a
    tape and an op callback are the Python path's, as before."""
    def f(a: tf.Tensor) -> dict:
        return {"twice": a * 2.0, "parts": (a + 1.0, tf.reduce_sum(a))}

    fast = tf_op.compile(f, [tf.TensorSpec([None, 3])], cache_dir=tmp_path)
    x = tf.constant([[1.0, 2.0, 3.0]])
    fast(x)
    fast(x)
    assert list(fast._state.hits) == [((1, 3),)]
    taken: list[bool] = []
    real = _eager.call_compiled
    monkeypatch.setattr(_eager, "call_compiled", lambda *args: taken.append(real(*args) is not None) or real(*args))

    def same(got: dict, want: dict) -> None:
        tf.nest.map_structure(lambda g, w: np.testing.assert_array_equal(g.numpy(), w.numpy()), got, want)

    same(fast(x), f(x))
    assert taken == [True]
    same(fast(x.numpy()), f(x))
    with pytest.raises(ValueError, match="float64"):
        fast(tf.constant(x.numpy(), tf.float64))
    wider = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    same(fast(wider), f(wider))
    with tf.GradientTape() as tape:
        tape.watch(x)
        fast(x)
    assert taken[1:] == [False, False, False, False]
    same(fast(wider), f(wider))
    same(fast(wider), f(wider))  # the new shape, called once more, is the extension's too
    assert taken[-1] is True
    tf.debugging.enable_check_numerics()
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="TVMDSOOp"):
            fast(tf.constant([[np.nan, 0.0, 0.0]]))
    finally:
        tf.debugging.disable_check_numerics()
    assert taken[-1] is False
    inputs = [tf.constant(np.full((1, 3), k, np.float32)) for k in range(6)]

    def worker(k: int) -> None:  # threads at once, each on its own input, through the extension
        for _ in range(20):
            same(fast(inputs[k]), f(inputs[k]))

    run_in_threads(worker, len(inputs))
    assert taken[-1] is True
