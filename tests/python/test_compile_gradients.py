"""Gradients and tf_op.compile: the compiled library holds the function's variables
as constants, so neither they nor its inputs get a gradient from it. Asking for
one is an error that says so, raised when the gradient is computed; tf.stop_gradient
at the compiled output keeps the rest of a model training, and calls under no
tape run the op alone.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_op import CompiledFunction, compile

RTOL = ATOL = 1e-5

#: What the error says, whatever the mode: the compiled function, its frozen
#: variables, and the ways out.
FROZEN = (r"tf_op\.compile\(backbone\) has no gradient: .*backbone/hidden/kernel.* frozen into the library.*"
          r"call the original function under the tape.*tf\.stop_gradient.*model\.trainable = False")


@pytest.fixture(scope="module")
def model() -> keras.Model:
    keras.utils.set_random_seed(0)
    # Named: Keras numbers default names by what the process made before (sequential_31/dense_51).
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                             keras.layers.Dense(8, name="logits")], name="backbone")


@pytest.fixture(scope="module")
def fast(model: keras.Model, tmp_path_factory: pytest.TempPathFactory) -> CompiledFunction:
    return compile(model, [tf.TensorSpec([None, 16])], batch_sizes=[4],
                   cache_dir=tmp_path_factory.mktemp("cache"))


def _x() -> tf.Tensor:
    return tf.constant(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))


def _head() -> keras.layers.Dense:
    keras.utils.set_random_seed(1)
    head = keras.layers.Dense(2)
    head.build((None, 8))
    return head


def _in_mode(mode: str, step: Callable[[tf.Tensor], list[tf.Tensor | None]]) -> Callable[[tf.Tensor], list]:
    """Eager, traced for the inputs' shape, or traced with an unknown batch (the
    compiled function dispatches among its compiled shapes when the graph runs)."""
    if mode == "unknown batch":
        return tf.function(step, input_signature=[tf.TensorSpec([None, 16])])
    return tf.function(step) if mode == "tf.function" else step


@pytest.mark.parametrize("mode", ["eager", "tf.function", "unknown batch"])
def test_gradient_of_the_frozen_variables_is_an_error(model: keras.Model, fast: CompiledFunction, mode: str) -> None:
    """The fine-tuning trap: asked of the model's variables through the compiled
    function, the gradient was a silent None (an optimizer skipped them)."""
    x = _x()
    losses = []

    def step(x: tf.Tensor) -> list[tf.Tensor | None]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fast(x) ** 2)
        losses.append(loss)
        return tape.gradient(loss, model.trainable_variables)

    with pytest.raises(tf.errors.InvalidArgumentError, match=FROZEN):
        _in_mode(mode, step)(x)
    if mode == "eager":  # the forward pass under the tape ran the library, as without one
        np.testing.assert_allclose(losses[0].numpy(), np.sum(model(x, training=False).numpy() ** 2), rtol=RTOL)


def test_gradient_from_outside_a_tf_function_is_an_error_when_computed(model: keras.Model,
                                                                       fast: CompiledFunction) -> None:
    """A tf.function called under a tape: TF builds its backward function with the
    forward pass, and the error comes when the gradient is computed. Traced under
    no tape (inference), the function holds the library's op alone: no read of the
    variables, no custom gradient."""
    def ops(concrete: tf.types.experimental.ConcreteFunction) -> set[str]:
        return {op.type for op in concrete.graph.get_operations()}

    serve = tf.function(lambda x: fast(x))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(serve(_x()) ** 2)
        assert {"TVMDSOOp", "IdentityN"} <= ops(serve.get_concrete_function(_x()))
    with pytest.raises(tf.errors.InvalidArgumentError, match=FROZEN):
        tape.gradient(loss, model.trainable_variables)
    untaped = ops(tf.function(lambda x: fast(x)).get_concrete_function(_x()))
    assert "TVMDSOOp" in untaped and not untaped & {"ReadVariableOp", "IdentityN", "Assert"}


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_gradient_of_the_inputs_names_the_compiled_function(fast: CompiledFunction, mode: str) -> None:
    """Before, TVMDSOOp's own error: a function 'main' of a cache path, to be
    given a gradient with Module.func(grad=), which a compiled function cannot."""
    def step(x: tf.Tensor) -> list[tf.Tensor | None]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(fast(x))
        return tape.gradient(loss, x)

    with pytest.raises(tf.errors.InvalidArgumentError, match=FROZEN):
        _in_mode(mode, step)(_x())


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_other_variables_train_behind_stop_gradient_or_a_frozen_model(model: keras.Model, fast: CompiledFunction,
                                                                       mode: str) -> None:
    """A head trained on the compiled function's output: TF's tape runs the
    backward of every op on the way, asked for the head's variables or not, so
    the gradient reaches the compiled function (an error naming the way out)
    unless tf.stop_gradient keeps it off, or the model is frozen the Keras way
    (``trainable = False``, which leaves its tf.Variables trainable for TF's
    tapes). Either way the head's gradients are plain TF's on the original
    model's output."""
    head, x = _head(), _x()

    def step(stop: bool) -> Callable[[tf.Tensor], list[tf.Tensor | None]]:
        def grads(x: tf.Tensor) -> list[tf.Tensor | None]:
            with tf.GradientTape() as tape:
                features = fast(x)
                loss = tf.reduce_sum(head(tf.stop_gradient(features) if stop else features) ** 2)
            return tape.gradient(loss, head.trainable_variables)
        return _in_mode(mode, grads)

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(head(model(x, training=False)) ** 2)
    expected = tape.gradient(loss, head.trainable_variables)

    def check(got: list[tf.Tensor | None]) -> None:
        for g, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)

    with pytest.raises(tf.errors.InvalidArgumentError, match=FROZEN):
        step(stop=False)(x)
    check(step(stop=True)(x))
    model.trainable = False
    try:
        check(step(stop=False)(x))
    finally:
        model.trainable = True
