"""Training through TVM functions: TVMDSOOp's gradient (tf_op/gradients.py).

The libraries come from tests/modules/build_training.py, run in a subprocess (TVM's
compiler stays out of this process): a TVM dense layer and its gradient, the same
gradient in a library of its own, and an nn MLP whose gradient
``relax.transform.Gradient`` made (through ``tf_op_tvm.add_gradient``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import MODULES_DIR, TVM_PYTHON
from helpers import run_python

import tf_op


@pytest.fixture(scope="module")
def training_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("training")
    subprocess.run([TVM_PYTHON, str(MODULES_DIR / "build_training.py"), str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def dense_lib(training_dir: Path) -> tf_op.Module:
    return tf_op.Module(training_dir / "dense.so")


def tvm_dense(module: tf_op.Module, dtype: str, x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """x @ w + b by TVM, with its TVM gradient; any batch, eager or traced."""
    suffix = {"float32": "f32", "float64": "f64"}[dtype]
    fn = module.func(f"dense_{suffix}", output_shape=[tf.shape(x)[0], tf.shape(w)[1]], grad=f"dense_{suffix}_grad")
    return fn(x, w, b)


def dense_problem(dtype: str, seed: int = 0) -> tuple[tf.Tensor, tf.Variable, tf.Variable, tf.Tensor]:
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((6, 5)), dtype)
    w = tf.Variable(rng.standard_normal((5, 3)), dtype=dtype)
    b = tf.Variable(rng.standard_normal(3), dtype=dtype)
    weights = tf.constant(rng.standard_normal((6, 3)), dtype)  # makes every output matter differently
    return x, w, b, weights


# --- gradients against TensorFlow's own ------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_dense_gradient_matches_matmul(dense_lib: tf_op.Module, dtype: str, mode: str) -> None:
    x, w, b, weights = dense_problem(dtype)

    def grads(tvm: bool) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tvm_dense(dense_lib, dtype, x, w, b) if tvm else tf.matmul(x, w) + b
            loss = tf.reduce_sum(tf.sin(y) * weights)
        return tape.gradient(loss, [x, w, b])

    run = tf.function(grads) if mode == "tf.function" else grads
    got, expected = run(True), run(False)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dense_gradient_matches_numeric(dense_lib: tf_op.Module, dtype: str) -> None:
    """tf.test.compute_gradient: the Jacobians TF builds from the TVM gradient
    against finite differences of the TVM function itself."""
    x, w, b, _ = dense_problem(dtype, seed=1)
    theoretical, numerical = tf.test.compute_gradient(
        lambda x, w, b: tvm_dense(dense_lib, dtype, x, w, b), [x, w.numpy(), b.numpy()]
    )
    tol = 2e-2 if dtype == "float32" else 1e-7  # float32 finite differences are coarse
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=tol, atol=tol)


def test_integer_input_gets_none_in_tf1_gradients(dense_lib: tf_op.Module) -> None:
    """TF1 graphs: tf.gradients through the op. scale_int(x, k) = x * k takes an
    int32 k, whose gradient is None."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None])
        k = tf.compat.v1.placeholder(tf.int32, [None])
        c = tf.compat.v1.placeholder(tf.float32, [None])
        y = dense_lib.func("scale_int", grad="scale_int_grad")(x, k)
        gx, gk = tf.gradients(tf.reduce_sum(y * c), [x, k])
        assert gk is None
        assert gx.shape.as_list() == [None]
        with tf.compat.v1.Session(graph=graph) as sess:
            feed = {x: [1.0, 2.0, 3.0], k: [2, -1, 5], c: [0.5, 3.0, -1.0]}
            np.testing.assert_array_equal(sess.run(gx, feed_dict=feed), [1.0, -3.0, -5.0])


def test_unused_output_gets_zero_upstream_gradient(dense_lib: tf_op.Module) -> None:
    """tf.gradients gives None for an output the loss does not use; the gradient
    function gets zeros there. two_outputs(x) = (2x, 3x)."""
    with tf.Graph().as_default() as graph:
        x = tf.constant([1.0, -2.0, 4.0])
        twice, thrice = dense_lib.func("two_outputs", output_shapes=[None, None], grad="two_outputs_grad")(x)
        only_twice = tf.gradients(tf.reduce_sum(twice), x)[0]
        both = tf.gradients(tf.reduce_sum(twice) + tf.reduce_sum(thrice), x)[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            np.testing.assert_array_equal(sess.run(only_twice), [2.0, 2.0, 2.0])
            np.testing.assert_array_equal(sess.run(both), [5.0, 5.0, 5.0])


# --- what has no gradient ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_function_without_grad_is_a_clear_error(dense_lib: tf_op.Module, mode: str) -> None:
    """Only differentiating through the function needs a gradient: behind
    tf.stop_gradient it needs none, nor does a function of integers."""
    x, w, b, _ = dense_problem("float32")
    no_grad = dense_lib.func("dense_f32", output_shape=[6, 3])
    int_double = dense_lib.func("int_double")

    def grads(stop: bool) -> list[tf.Tensor | None]:
        with tf.GradientTape() as tape:
            scale = tf.cast(int_double(tf.constant([1, 2, 3])), tf.float32)  # [2, 4, 6]
            y = no_grad(x, w, b)
            loss = tf.reduce_sum(tf.stop_gradient(y) if stop else y) + tf.reduce_sum(b * scale)
        return tape.gradient(loss, [w, b])

    run = tf.function(grads) if mode == "tf.function" else grads
    gw, gb = run(True)
    assert gw is None
    np.testing.assert_array_equal(gb.numpy(), [2.0, 4.0, 6.0])
    # TF's own error for an op without a gradient, which autograph reports inside
    # a tf.function as a StagingError with the same message.
    expected = LookupError if mode == "eager" else Exception
    with pytest.raises(expected, match=r"function 'dense_f32'.* has no gradient.*grad=.*tf\.stop_gradient"):
        run(False)


def test_second_order_is_a_clear_error(dense_lib: tf_op.Module) -> None:
    """The gradient op has no gradient of its own: second derivatives name it."""
    x, w, b, _ = dense_problem("float32")
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            loss = tf.reduce_sum(tvm_dense(dense_lib, "float32", x, w, b) ** 2)
        gw = inner.gradient(loss, w)
        total = tf.reduce_sum(gw)
    with pytest.raises(LookupError, match="function 'dense_f32_grad'.* has no gradient"):
        outer.gradient(total, w)


def test_grad_must_be_a_name_or_func(dense_lib: tf_op.Module) -> None:
    with pytest.raises(TypeError, match="grad must be a function name or a tf_op.Func, got int"):
        dense_lib.func("dense_f32", grad=3)


def test_gradient_input_of_unknown_rank_is_a_clear_error(dense_lib: tf_op.Module) -> None:
    """A destination-passing gradient's outputs are declared from its inputs'
    shapes: an unknown rank (other than the first input's, which the op can
    take at run time) cannot be."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 5])
        w = tf.compat.v1.placeholder(tf.float32, None)
        b = tf.compat.v1.placeholder(tf.float32, [3])
        fn = dense_lib.func("dense_f32", output_shape=[tf.shape(x)[0], tf.shape(w)[1]], grad="dense_f32_grad")
        loss = tf.reduce_sum(fn(x, w, b))
        with pytest.raises(ValueError, match="gradient 'dense_f32_grad' of function 'dense_f32': input 1 has an "
                                             "unknown rank"):
            tf.gradients(loss, [w])


def test_gradient_giving_what_the_contract_does_not_is_a_clear_error(training_dir: Path) -> None:
    """Relax's own adjoint returns (value, (grads...)): one tensor more than the
    gradients the op declares. add_gradient's function returns the grads only."""
    params = [tf.constant(v) for v in np.load(training_dir / "mlp_train.npz").values()]
    model = tf_op.Module(training_dir / "mlp_train.so")
    x = tf.constant(np.ones((2, 4), np.float32))
    for grad, error in (("forward_grad_vjp_adjoint", "returned 6 tensor\\(s\\), but the op declares 5 output"),
                        ("forward_grad", None)):
        forward = model.func("forward", output_shapes=[[None, 3]], grad=grad)
        with tf.GradientTape() as tape:
            tape.watch(params)
            loss = tf.reduce_sum(forward(x, *params))
        if error is None:
            assert all(g is not None for g in tape.gradient(loss, params))
            continue
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"function '{grad}' of .*mlp_train.so: {error}"):
            tape.gradient(loss, params)


# --- Keras ---------------------------------------------------------------------------


class TVMDense(keras.layers.Layer):
    """keras.layers.Dense (no activation) computed by TVM, with its TVM gradient."""

    def __init__(self, units: int, library: str, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.supports_jit = False  # XLA cannot compile custom ops
        self.units = units
        self.module = tf_op.Module(library)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform", name="kernel")
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return tvm_dense(self.module, "float32", x, self.kernel, self.bias)


def regression_data(seed: int, samples: int, features: int, units: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    w = rng.standard_normal((features, units)).astype(np.float32)
    return x, (x @ w + 0.3 + 0.05 * rng.standard_normal((samples, units))).astype(np.float32)


def test_keras_model_with_tvm_dense_trains_like_keras_dense(training_dir: Path) -> None:
    """The same model, TVM's dense layer or Keras's, same initial weights and data:
    the loss falls the same way, epoch by epoch, and the weights end up the same."""
    x, y = regression_data(seed=4, samples=200, features=5, units=2)  # the last batch of 32 is partial
    keras.utils.set_random_seed(5)
    models = [keras.Sequential([keras.Input((5,)), layer])
              for layer in (TVMDense(2, str(training_dir / "dense.so")), keras.layers.Dense(2))]
    models[0].set_weights(models[1].get_weights())
    losses = []
    for model in models:
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        losses.append(model.fit(x, y, batch_size=32, epochs=6, shuffle=False, verbose=0).history["loss"])
    assert losses[0][-1] < losses[0][0] / 5, losses[0]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    for got, expected in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def mlp_keras(params: dict[str, np.ndarray]) -> keras.Model:
    """The nn MLP in Keras: nn.Linear keeps its weight as [out, in]."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.set_weights([params["w1"].T, params["b1"], params["w2"].T, params["b2"]])
    return model


def test_relax_model_trains_one_epoch_like_keras(training_dir: Path) -> None:
    """A relax.frontend.nn MLP with its TVM-made gradient as a ModelLayer: Keras's
    optimizer trains its params, as it trains the same MLP written in Keras."""
    params = dict(np.load(training_dir / "mlp_train.npz"))
    layer = tf_op.ModelLayer(
        training_dir / "mlp_train.so", "forward", grad="forward_grad",
        params=[params[k] for k in ("w1", "b1", "w2", "b2")], output_shapes=[[None, 3]],
    )
    assert len(layer.trainable_weights) == 4
    assert layer.supports_jit is False  # Keras's jit_compile="auto" keeps XLA off (it would on a GPU)
    tvm_model = keras.Sequential([keras.Input((4,)), layer])
    keras_model = mlp_keras(params)
    x, y = regression_data(seed=6, samples=96, features=4, units=3)
    losses = []
    for model in (tvm_model, keras_model):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        before = model.evaluate(x, y, verbose=0)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        losses.append((before, model.evaluate(x, y, verbose=0)))
    assert losses[0][1] < losses[0][0], losses
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    w1, b1, w2, b2 = (w.numpy() for w in layer.trainable_weights)
    for got, expected in zip([w1.T, b1, w2.T, b2], keras_model.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# --- SavedModels -----------------------------------------------------------------------


class DenseModel(tf.Module):
    """A TVM dense layer whose gradient lives in another library."""

    def __init__(self, forward: Path, gradient: Path, w: np.ndarray, b: np.ndarray) -> None:
        super().__init__()
        self.forward = tf_op.Module(forward)
        self.gradient = tf_op.Module(gradient).func("dense_f32_grad")
        self.w = tf.Variable(w)
        self.b = tf.Variable(b)

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        fn = self.forward.func("dense_f32", output_shape=[tf.shape(x)[0], 3], grad=self.gradient)
        return fn(x, self.w, self.b)


TRAIN_STEP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_op

    model = tf.saved_model.load(sys.argv[1])
    x, target = (tf.constant(np.array(v, np.float32)) for v in json.loads(sys.argv[2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - target) ** 2)
    for v, g in zip([model.w, model.b], tape.gradient(loss, [model.w, model.b])):
        v.assign_sub(0.1 * g)
    print(json.dumps([model.w.numpy().tolist(), model.b.numpy().tolist()]))
    """
)


def test_savedmodel_with_gradient_trains_in_fresh_process(training_dir: Path, tmp_path: Path) -> None:
    """Both libraries travel as assets: moved, with the libraries it was made
    from gone, the SavedModel trains one step in a fresh process, as TF's own
    ops would."""
    private = tmp_path / "libs"
    private.mkdir()
    for name in ("dense.so", "dense_grad.so"):
        shutil.copy(training_dir / name, private / name)
    x, w, b, _ = dense_problem("float32", seed=2)
    target = np.random.default_rng(3).standard_normal((6, 3)).astype(np.float32)
    tf.saved_model.save(DenseModel(private / "dense.so", private / "dense_grad.so", w.numpy(), b.numpy()),
                        str(tmp_path / "saved"))
    shutil.rmtree(private)
    moved = tmp_path / "elsewhere" / "model"
    shutil.move(tmp_path / "saved", moved)
    assert sorted(p.name for p in (moved / "assets").iterdir()) == ["dense.so", "dense_grad.so"]

    done = run_python(TRAIN_STEP_SCRIPT, str(moved), json.dumps([x.numpy().tolist(), target.tolist()]))
    assert done.returncode == 0, done.stderr[-3000:]
    got_w, got_b = (np.array(v, np.float32) for v in json.loads(done.stdout.strip().splitlines()[-1]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) + b - target) ** 2)
    gw, gb = tape.gradient(loss, [w, b])
    np.testing.assert_allclose(got_w, (w - 0.1 * gw).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_b, (b - 0.1 * gb).numpy(), rtol=1e-5, atol=1e-6)
