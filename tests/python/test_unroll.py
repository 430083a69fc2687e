"""tf_op.compiler.unroll: the loops of a tf_op.auto cluster that run a number of
steps known ahead become that many calls of their body before the cluster is
converted; other loops stay loops. The cluster's function is built as the
compile worker builds it (cluster.concrete_function, from a FunctionDef and
the functions it calls) and checked against TF running the original."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

from tf_op.compiler import cluster, unroll
from tf_op.compiler.errors import CompileError

W = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32) * 0.5


def _step(h: tf.Tensor) -> tf.Tensor:
    return tf.tanh(tf.matmul(h, W))


def _counted(steps: int) -> Callable[[tf.Tensor], tf.Tensor]:
    return lambda x: tf.while_loop(lambda i, h: i < steps, lambda i, h: (i + 1, _step(h)), (0, x))[1]


def _sequence(steps: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """Each step written to a TensorArray at its own index, as a layer that
    returns its whole sequence does."""

    def run(x: tf.Tensor) -> tf.Tensor:
        written = tf.TensorArray(tf.float32, size=steps, element_shape=x.shape)

        def body(i: tf.Tensor, h: tf.Tensor, out: tf.TensorArray) -> tuple[tf.Tensor, tf.Tensor, tf.TensorArray]:
            h = _step(h)
            return i + 1, h, out.write(i, h)

        return tf.while_loop(lambda i, h, out: i < steps, body, (0, x, written))[2].stack()

    return run


def _until_small(x: tf.Tensor) -> tf.Tensor:  # how many steps depends on x
    return tf.while_loop(lambda h: tf.reduce_max(tf.abs(h)) > 0.05, lambda h: h * 0.5, (x,))[0]


def _as_worker_builds_it(fn: Callable[[tf.Tensor], tf.Tensor], x: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The op types of the cluster's graph as the worker traces it, and what it computes for x."""
    traced = tf.function(fn, autograph=False).get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
    called = list(traced.graph.as_graph_def().library.function)
    spec = [{"dtype": tf.float32.as_datatype_enum, "shape": list(x.shape)}]
    built = cluster.concrete_function(traced.function_def, spec, called)
    [got] = built(tf.constant(x))
    return [op.type for op in built.graph.get_operations()], got.numpy()


@pytest.mark.parametrize("steps", [1, 5, unroll.MAX_STEPS])
def test_a_loop_of_known_steps_becomes_that_many_calls_of_its_body(steps: int) -> None:
    x = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    ops, got = _as_worker_builds_it(_counted(steps), x)
    assert "While" not in ops and "StatelessWhile" not in ops, ops
    assert ops.count("PartitionedCall") == steps
    want = x
    for _ in range(steps):
        want = np.tanh(want @ W)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_loop_writing_each_step_is_unrolled() -> None:
    x = np.random.default_rng(3).random((3, 4), dtype=np.float32)
    ops, got = _as_worker_builds_it(_sequence(4), x)
    assert "While" not in ops and ops.count("PartitionedCall") == 4, ops
    np.testing.assert_allclose(got, tf.function(_sequence(4), autograph=False)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_loop_writing_each_step_that_cannot_be_unrolled_is_refused_with_the_reason() -> None:
    """TVM's frontend cannot take it as a loop: the compile fails at once, saying why."""
    x = np.random.default_rng(3).random((3, 4), dtype=np.float32)
    with pytest.raises(CompileError, match=f"writes each of its steps .* more than {unroll.MAX_STEPS}"):
        _as_worker_builds_it(_sequence(unroll.MAX_STEPS + 1), x)


@pytest.mark.parametrize(("fn", "why"), [(_counted(unroll.MAX_STEPS + 1), "too many steps"),
                                         (_until_small, "steps that depend on the data")])
def test_other_loops_stay_loops(fn: Callable[[tf.Tensor], tf.Tensor], why: str) -> None:
    x = np.random.default_rng(2).random((3, 4), dtype=np.float32)
    ops, got = _as_worker_builds_it(fn, x)
    assert "While" in ops or "StatelessWhile" in ops, why
    assert "PartitionedCall" not in ops, why
    np.testing.assert_allclose(got, tf.function(fn, autograph=False)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_compiled_functions_loops_are_unrolled_with_its_variables_frozen() -> None:
    """tf_op.compile's function (a Keras RNN's loop reads the layer's
    variables): the loops become calls, the variables constants, the answers
    the model's."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 5)), keras.layers.LSTM(8, return_sequences=True),
                              keras.layers.LSTM(4), keras.layers.Dense(3)])
    x = np.random.default_rng(4).standard_normal((2, 6, 5)).astype(np.float32)
    concrete = tf.function(lambda t: model(t, training=False)).get_concrete_function(tf.TensorSpec(x.shape))
    built = unroll.unrolled(concrete)
    ops = [op.type for op in built.graph.get_operations()]
    assert "While" not in ops and "StatelessWhile" not in ops and ops.count("PartitionedCall") == 12, ops
    assert not built.graph.variables and not built.captured_inputs
    [got] = built(tf.constant(x))
    np.testing.assert_allclose(got.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_compiled_function_without_loops_is_left_as_it_is() -> None:
    concrete = tf.function(_step).get_concrete_function(tf.TensorSpec((3, 4)))
    assert unroll.unrolled(concrete) is concrete
