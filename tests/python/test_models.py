"""Whole models (Relax VM executables) and TVM-FFI functions that return their
outputs, run by TVMDSOOp: values against Keras, numpy and ONNX's reference
evaluator; symbolic batches; graphs, sessions, Keras and SavedModels; threads;
the checks of what comes back; zero copy, and TF never writing into returned
memory.

The libraries are built by the ``models_dir`` and ``modules_dir`` fixtures in
subprocesses: TVM's compiler is never imported here."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import onnx.reference
import pytest
import tensorflow as tf

import tf_op
from helpers import buffer_address, run_in_threads, run_python

#: The largest difference allowed between TVM's float32 results and a reference.
ATOL = 1e-5


# --- helpers and fixtures --------------------------------------------------------




def mlp_reference(x: np.ndarray, p: list[np.ndarray]) -> np.ndarray:
    """forward of build_models.MLP: Linear(16, 32) + ReLU + Linear(32, 8), in float64."""
    x64, (w1, b1, w2, b2) = x.astype(np.float64), [q.astype(np.float64) for q in p]
    return np.maximum(x64 @ w1.T + b1, 0.0) @ w2.T + b2


def assert_close(got: np.ndarray, expected: np.ndarray, atol: float = ATOL) -> None:
    """Same shape, every element within atol (float32 rounding of a float64 result)."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=atol)


@pytest.fixture(scope="module")
def mlp_params(models_dir: Path) -> list[np.ndarray]:
    """p0..p3 in the order ``forward`` takes them after x."""
    with np.load(models_dir / "mlp_params.npz") as npz:
        return [npz[f"p{k}"] for k in range(4)]


@pytest.fixture(scope="module")
def keras_cnn(models_dir: Path) -> keras.Model:
    """The Keras model the CNN libraries were converted from: the reference."""
    return keras.models.load_model(models_dir / "cnn.keras")


@pytest.fixture(scope="module")
def ffi(ffilib: str) -> tf_op.Module:
    return tf_op.Module(ffilib)


def images(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 16, 16, 3)).astype(np.float32)


# --- 1. the Keras CNN, through TFLite --------------------------------------------


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_cnn_matches_keras(models_dir: Path, keras_cnn: keras.Model, batch: int, mode: str) -> None:
    """TVM's compile of the TFLite form must give what Keras gives."""
    fn = tf_op.Module(models_dir / f"cnn_b{batch}.so").func("main", output_shape=[batch, 10])
    if mode == "tf.function":
        fn = tf.function(lambda x, f=fn: f(x), input_signature=[tf.TensorSpec([batch, 16, 16, 3], tf.float32)])
    for seed in range(3):
        x = images(batch, seed)
        got = fn(tf.constant(x))
        assert got.dtype == tf.float32 and got.shape == (batch, 10)
        expected = keras_cnn(x, training=False).numpy()
        assert np.max(np.abs(got.numpy() - expected)) < ATOL


def test_outputs_keep_their_values_after_later_calls(models_dir: Path, keras_cnn: keras.Model) -> None:
    """Returned outputs are taken without a copy: the VM must not reuse their
    memory for later calls while TF still holds them."""
    fn = tf_op.Module(models_dir / "cnn_b4.so").func("main")
    inputs = [images(4, seed) for seed in range(6)]
    outputs = [fn(tf.constant(x)) for x in inputs]
    for x, got in zip(inputs, outputs):
        assert np.max(np.abs(got.numpy() - keras_cnn(x, training=False).numpy())) < ATOL


# --- 2. the MLP, params as inputs, symbolic batch --------------------------------


@pytest.mark.parametrize("params_as", ["constants", "variables"])
def test_mlp_symbolic_batch_in_one_tf_function(models_dir: Path, mlp_params: list[np.ndarray], params_as: str) -> None:
    """One graph, traced once for [None, 16], serves every batch size."""
    forward = tf_op.Module(models_dir / "mlp.so").func("forward", output_shape=[None, 8])
    make = tf.constant if params_as == "constants" else tf.Variable
    params = [make(p) for p in mlp_params]

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x: tf.Tensor) -> tf.Tensor:
        return forward(x, *params)

    assert f.get_concrete_function().structured_outputs.shape.as_list() == [None, 8]
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        assert_close(f(tf.constant(x)).numpy(), mlp_reference(x, mlp_params))
    assert f.experimental_get_tracing_count() == 1


def test_mlp_eager_reads_variables_at_each_call(models_dir: Path, mlp_params: list[np.ndarray]) -> None:
    """Params passed as variables: a new value is what the next call uses."""
    forward = tf_op.Module(models_dir / "mlp.so").func("forward", output_shape=[None, 8])
    params = [tf.Variable(p) for p in mlp_params]
    x = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)
    assert_close(forward(tf.constant(x), *params).numpy(), mlp_reference(x, mlp_params))
    params[3].assign(mlp_params[3] + 10.0)
    changed = [*mlp_params[:3], mlp_params[3] + 10.0]
    assert_close(forward(tf.constant(x), *params).numpy(), mlp_reference(x, changed))


# --- 3. nested tuple outputs -----------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_nested_tuple_flattened_into_three_outputs(models_dir: Path, mode: str) -> None:
    """(x + 1, (x * 2, sum(x, 1))) comes back as three outputs, in order."""
    fn = tf_op.Module(models_dir / "two_outputs.so").func("main", output_shapes=[[None, 4], [None, 4], [None]])
    if mode == "tf.function":
        fn = tf.function(lambda x, f=fn: f(x), input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        shapes = [t.shape.as_list() for t in fn.get_concrete_function().structured_outputs]
        assert shapes == [[None, 4], [None, 4], [None]]
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        a, b, c = fn(tf.constant(x))
        assert a.dtype == b.dtype == c.dtype == tf.float32
        np.testing.assert_array_equal(a.numpy(), x + 1)
        np.testing.assert_array_equal(b.numpy(), x * 2)
        assert_close(c.numpy(), x.astype(np.float64).sum(axis=1))


# --- 4. an ONNX model --------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 6])
def test_onnx_model_matches_reference_evaluator(models_dir: Path, batch: int) -> None:
    """Two inputs, two outputs, against ONNX's own reference implementation."""
    fn = tf_op.Module(models_dir / "onnx_model.so").func("main", output_shapes=[[None, 4], [None, 4]])
    reference = onnx.reference.ReferenceEvaluator(str(models_dir / "onnx_model.onnx"))
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = rng.standard_normal((batch, 4)).astype(np.float32)
    relu, sigmoid = fn(tf.constant(x), tf.constant(y))
    expected_relu, expected_sigmoid = reference.run(None, {"x": x, "y": y})
    assert_close(relu.numpy(), expected_relu)
    assert_close(sigmoid.numpy(), expected_sigmoid)
    assert (relu.numpy() >= 0).all() and (relu.numpy() == 0).any()  # the reference is not trivial


# --- 5. threads --------------------------------------------------------------------


def test_threads_share_model_functions(models_dir: Path, mlp_params: list[np.ndarray], keras_cnn: keras.Model) -> None:
    """8 threads, one MLP function and one CNN function, many calls each: the VM
    pool must give each call its own instance and each result its own memory."""
    forward = tf_op.Module(models_dir / "mlp.so").func("forward", output_shape=[None, 8])
    cnn = tf_op.Module(models_dir / "cnn_b4.so").func("main", output_shape=[4, 10])
    params = [tf.constant(p) for p in mlp_params]
    cnn_inputs = [images(4, seed) for seed in range(4)]
    cnn_expected = [keras_cnn(x, training=False).numpy() for x in cnn_inputs]
    calls = [0] * 8

    def worker(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        kept = []
        for i in range(40):
            batch = int(rng.integers(1, 9))
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            y = forward(tf.constant(x), *params)
            kept.append((y, mlp_reference(x, mlp_params)))
            assert_close(y.numpy(), kept[-1][1])
            j = (k + i) % len(cnn_inputs)
            assert np.max(np.abs(cnn(tf.constant(cnn_inputs[j])).numpy() - cnn_expected[j])) < ATOL
            calls[k] += 2
        for y, expected in kept:  # still right after the other threads' calls
            assert_close(y.numpy(), expected)

    run_in_threads(worker, 8)
    assert calls == [80] * 8


# --- 6. SavedModels, moved, loaded in a fresh process -----------------------------


LOAD_MODEL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_op

    model = tf.saved_model.load(sys.argv[1])
    x = tf.constant(np.array(json.loads(sys.argv[2]), np.float32))
    print(json.dumps(model.serve(x).numpy().tolist()))
    """
)


class LayerServing(tf.Module):
    """A ModelLayer (the MLP, its params as layer weights) behind a signature."""

    def __init__(self, lib: Path, params: list[np.ndarray]) -> None:
        super().__init__()
        self.layer = tf_op.ModelLayer(lib, "forward", params=params, output_shapes=[[None, 8]])

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def serve(self, x: tf.Tensor) -> tf.Tensor:
        return self.layer(x)


class FuncServing(tf.Module):
    """A model Func held by a plain tf.Module."""

    def __init__(self, lib: Path) -> None:
        super().__init__()
        self.fn = tf_op.Module(lib).func("main", output_shape=[4, 10])

    @tf.function(input_signature=[tf.TensorSpec([4, 16, 16, 3], tf.float32)])
    def serve(self, x: tf.Tensor) -> tf.Tensor:
        return self.fn(x)


@pytest.mark.parametrize("holder", ["ModelLayer", "tf.Module"])
def test_relocated_savedmodel_runs_in_fresh_process(
    tmp_path: Path, models_dir: Path, mlp_params: list[np.ndarray], keras_cnn: keras.Model, holder: str
) -> None:
    """The model's library travels as an asset: after the SavedModel is moved
    and the library it was made from is gone, a fresh process still runs it."""
    private = tmp_path / "lib" / ("mlp.so" if holder == "ModelLayer" else "cnn.so")
    private.parent.mkdir()
    if holder == "ModelLayer":
        shutil.copy(models_dir / "mlp.so", private)
        serving: tf.Module = LayerServing(private, mlp_params)
        x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
        expected = mlp_reference(x, mlp_params)
    else:
        shutil.copy(models_dir / "cnn_b4.so", private)
        serving = FuncServing(private)
        x = images(4, 7)
        expected = keras_cnn(x, training=False).numpy()
    tf.saved_model.save(serving, str(tmp_path / "saved"))
    shutil.rmtree(private.parent)
    moved = tmp_path / "elsewhere" / "model"
    shutil.move(tmp_path / "saved", moved)
    assert list((moved / "assets").iterdir()), "the library travels as an asset"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_python(LOAD_MODEL_SCRIPT, str(moved), json.dumps(x.tolist()), cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.array(json.loads(done.stdout.strip().splitlines()[-1]), np.float32)
    assert_close(got, expected)


# --- 7. TF1 graphs and sessions ----------------------------------------------------


def test_tf1_session_runs_model_function(models_dir: Path, mlp_params: list[np.ndarray]) -> None:
    """Graphs built without tf.function (placeholders, Session.run) run models too."""
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        forward = tf_op.Module(models_dir / "mlp.so").func("forward", output_shape=[None, 8])
        y = forward(x, *[tf.constant(p) for p in mlp_params])
        assert y.shape.as_list() == [None, 8]
        with tf.compat.v1.Session(graph=g) as sess:
            for batch in (1, 4):
                value = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
                assert_close(sess.run(y, feed_dict={x: value}), mlp_reference(value, mlp_params))


# --- 8. Keras --------------------------------------------------------------------


def test_model_layer_in_keras_model(models_dir: Path, mlp_params: list[np.ndarray]) -> None:
    """ModelLayer's params become non-trainable weights passed after the input."""
    layer = tf_op.ModelLayer(models_dir / "mlp.so", "forward", params=mlp_params, output_shapes=[[None, 8]])
    inputs = keras.Input(shape=(16,))
    model = keras.Model(inputs, layer(inputs))
    assert not layer.trainable_weights and len(layer.non_trainable_weights) == 4
    for weight, value in zip(layer.non_trainable_weights, mlp_params):
        np.testing.assert_array_equal(weight.numpy(), value)
    x = np.random.default_rng(11).standard_normal((13, 16)).astype(np.float32)
    got = model.predict(x, batch_size=5, verbose=0)  # the last batch holds 3
    assert_close(got, mlp_reference(x, mlp_params))


def test_model_layer_refuses_a_library_that_is_not_a_model(ffilib: str) -> None:
    with pytest.raises(ValueError, match="not a whole model"):
        tf_op.ModelLayer(ffilib, output_shapes=[[None]])


def test_model_layer_needs_output_shapes(models_dir: Path, mlp_params: list[np.ndarray]) -> None:
    """Keras needs each output's rank: a shape left out is refused when made, not when Keras traces."""
    with pytest.raises(TypeError):
        tf_op.ModelLayer(models_dir / "mlp.so", "forward", params=mlp_params)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="every output needs a shape"):
        tf_op.ModelLayer(models_dir / "mlp.so", "forward", params=mlp_params, output_shapes=[None])


# --- 9. errors: reported, checked, and the process lives on -----------------------


@pytest.mark.parametrize(
    ("case", "error", "pattern"),
    [
        ("missing function", tf.errors.NotFoundError, r"'nope'.*its functions are main"),
        ("too many inputs", tf.errors.InvalidArgumentError, r"'main'.*takes 1 input\(s\), got 2"),
        ("no input", tf.errors.InvalidArgumentError, r"'main'.*takes 1 input\(s\), got 0"),
        ("declared dtype", tf.errors.InvalidArgumentError, r"output 0 is float32, but the op declares (double|float64)"),
        ("declared shape", tf.errors.InvalidArgumentError, r"output 0 has shape \[4,10\], but the op declares \[3,10\]"),
        ("declared rank", tf.errors.InvalidArgumentError, r"output 0 has shape \[4,10\], but the op declares \[4,10,1\]"),
        ("declared shape, one dimension free", tf.errors.InvalidArgumentError,
         r"output 0 has shape \[4,10\], but the op declares \[\?,9\]"),
        ("output count", tf.errors.InvalidArgumentError, r"returned 1 tensor\(s\), but the op declares 2 output"),
        ("VM shape check", tf.errors.InvalidArgumentError,
         r"'main'.*: input 0 \(\w+\) does not match the model's signature, which expects R\.Tensor\(\(4, 16, 16, 3\), "
         r"dtype=\"float32\"\): RuntimeError: .*mismatch"),
        ("VM rank check", tf.errors.InvalidArgumentError,
         r"'main'.*: input 0 \(\w+\) does not match the model's signature, .*expect Tensor with ndim 4 but get 3"),
        ("VM dtype check", tf.errors.InvalidArgumentError,
         r"'main'.*: input 0 \(\w+\) does not match the model's signature, .*expect Tensor with dtype float32"),
    ],
)
def test_model_errors(models_dir: Path, keras_cnn: keras.Model, case: str, error: type, pattern: str) -> None:
    """Every mistake is an error naming the function; the next good call works."""
    cnn = tf_op.Module(models_dir / "cnn_b4.so")
    x = tf.constant(images(4, 0))
    calls: dict[str, Callable[[], object]] = {
        "missing function": lambda: cnn.func("nope")(x),
        "too many inputs": lambda: cnn.func("main")(x, x),
        "no input": lambda: cnn.func("main", output_dtype=tf.float32)(),
        "declared dtype": lambda: cnn.func("main", output_dtype=tf.float64)(x),
        "declared shape": lambda: cnn.func("main", output_shape=[3, 10])(x),
        "declared rank": lambda: cnn.func("main", output_shape=[4, 10, 1])(x),
        "declared shape, one dimension free": lambda: cnn.func("main", output_shape=[None, 9])(x),
        "output count": lambda: cnn.func("main", output_shapes=[None, None])(x),
        "VM shape check": lambda: cnn.func("main")(tf.constant(images(2, 0))),
        "VM rank check": lambda: cnn.func("main", output_shape=[4, 10], output_dtype=tf.float32)(x[0]),
        "VM dtype check": lambda: cnn.func("main", output_shape=[4, 10], output_dtype=tf.float32)(
            tf.cast(x, tf.float64)),
    }
    with pytest.raises(error, match=f"(?s){pattern}"):
        calls[case]()
    for shape in ([4, 10], [None, 10]):
        got = cnn.func("main", output_shape=shape)(x)
        assert np.max(np.abs(got.numpy() - keras_cnn(x, training=False).numpy())) < ATOL


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_missing_function_lists_the_models_functions(models_dir: Path, mode: str) -> None:
    fn = tf_op.Module(models_dir / "mlp.so").func("main")
    if mode == "tf.function":
        fn = tf.function(lambda x, f=fn: f(x))
    with pytest.raises(tf.errors.NotFoundError, match="its functions are forward"):
        fn(tf.ones([1, 16]))


def test_returns_false_on_a_model_is_refused(models_dir: Path) -> None:
    with pytest.raises(ValueError, match="whole model"):
        tf_op.Module(models_dir / "cnn_b4.so").func("main", returns=False)


@pytest.mark.parametrize("shape", [[tf.constant(4), 10], tf.constant([4, 10]), "4,10"])
def test_returning_function_takes_only_ints_and_none(models_dir: Path, shape: object) -> None:
    """What comes back is checked against the declaration: a tensor cannot say it."""
    with pytest.raises(ValueError, match="returns its outputs"):
        tf_op.Module(models_dir / "cnn_b4.so").func("main", output_shape=shape)


# --- 10. zero copy, copies, and no writes into returned memory --------------------


def test_identity_output_is_the_input_buffer(ffi: tf_op.Module) -> None:
    """A returned tensor TF can take (aligned, same device) is not copied."""
    identity = ffi.func("identity", returns=True)
    x = tf.constant(np.arange(64, dtype=np.float32))
    assert buffer_address(x) % 64 == 0
    y = identity(x)
    np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32))
    assert buffer_address(y) == buffer_address(x)
    del x  # y keeps the buffer alive through TVM's reference
    np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32))


def test_input_below_the_alignment_is_lent_through_aligned_memory(ffi: tf_op.Module) -> None:
    """Asked for more than TF's 64 bytes, the op lends TVM an aligned copy, which
    lives as long as TVM holds it: here, as the output itself."""
    identity = ffi.func("identity", returns=True, alignment=4096)
    x = tf.constant(np.arange(64, dtype=np.float32))
    y = identity(x)
    assert buffer_address(y) % 4096 == 0
    if buffer_address(x) % 4096:
        assert buffer_address(y) != buffer_address(x)
    np.testing.assert_array_equal(y.numpy(), np.arange(64, dtype=np.float32))


def test_misaligned_return_is_copied(ffi: tf_op.Module) -> None:
    """Memory 4 bytes past a 64-byte boundary cannot be a TF buffer: copied."""
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    y = ffi.func("add_one_misaligned", returns=True)(tf.constant(x))
    assert buffer_address(y) % 64 == 0
    np.testing.assert_array_equal(y.numpy(), x + 1)


def test_tuple_return_mixes_zero_copy_and_copy(ffi: tf_op.Module) -> None:
    """with_double returns (x, x * 2 in misaligned memory): the first is taken,
    the second copied."""
    x = tf.constant(np.arange(32, dtype=np.float32).reshape(4, 8))
    same, doubled = ffi.func("with_double", returns=True, output_shapes=[[4, 8], [None, 8]])(x)
    assert buffer_address(same) == buffer_address(x)
    assert buffer_address(doubled) % 64 == 0
    np.testing.assert_array_equal(same.numpy(), x.numpy())
    np.testing.assert_array_equal(doubled.numpy(), x.numpy() * 2)


def test_returning_plain_function_checks_what_comes_back(ffi: tf_op.Module) -> None:
    x = tf.constant([1.0, 2.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'identity'.*output 0 is float32, but the op declares int32"):
        ffi.func("identity", returns=True, output_dtype=tf.int32)(x)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'with_double'.*returned 2 tensor\(s\), but the op declares 1"):
        ffi.func("with_double", returns=True)(x)
    np.testing.assert_array_equal(ffi.func("identity", returns=True)(x).numpy(), [1.0, 2.0])


#: Ops TF may run in place, writing their output into their input's buffer when
#: nothing else holds it: on the identity's output that buffer is x's.
IN_PLACE_OPS: dict[str, tuple[Callable[[tf.Tensor], tf.Tensor], Callable[[np.ndarray], np.ndarray]]] = {
    "add": (lambda y: y + 1.0, lambda x: x + 1),
    "neg": (lambda y: tf.raw_ops.Neg(x=y), lambda x: -x),
    "relu": (lambda y: tf.nn.relu(y), lambda x: np.maximum(x, 0)),
    "mul": (lambda y: y * y, lambda x: x * x),
    "tensor_scatter_add": (
        lambda y: tf.raw_ops.TensorScatterAdd(tensor=y, indices=[[0], [2]], updates=[10.0, 20.0]),
        lambda x: x + np.array([10, 0, 20, 0] + [0] * (x.size - 4), np.float32),
    ),
}


@pytest.mark.parametrize("op", sorted(IN_PLACE_OPS))
@pytest.mark.parametrize("source", ["argument", "computed in the graph"])
def test_tf_never_writes_into_returned_memory(ffi: tf_op.Module, op: str, source: str) -> None:
    """y = identity(x) shares x's memory; an op that could forward y's buffer to
    its output must not, or it would overwrite x."""
    identity = ffi.func("identity", returns=True, output_shape=[None])
    apply, reference = IN_PLACE_OPS[op]
    base = np.linspace(-4, 4, 64, dtype=np.float32)

    if source == "argument":
        @tf.function
        def f(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return x, apply(identity(x))
    else:
        @tf.function
        def f(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            inner = x * 2.0  # a buffer of the graph's own
            return inner, apply(identity(inner))

    x = tf.constant(base)
    seen, z = f(x)
    fed = base if source == "argument" else base * 2
    np.testing.assert_array_equal(z.numpy(), reference(fed))
    np.testing.assert_array_equal(seen.numpy(), fed)
    np.testing.assert_array_equal(x.numpy(), base)


def test_eager_in_place_candidates_leave_the_input(ffi: tf_op.Module) -> None:
    """Eagerly too: y aliases x, and ops on y never change x."""
    base = np.arange(16, dtype=np.float32)
    x = tf.constant(base)
    y = ffi.func("identity", returns=True)(x)
    for apply, reference in IN_PLACE_OPS.values():
        np.testing.assert_array_equal(apply(y).numpy(), reference(base))
    np.testing.assert_array_equal(x.numpy(), base)
    np.testing.assert_array_equal(y.numpy(), base)


# --- 11. what a library is -----------------------------------------------------------


@pytest.mark.parametrize(
    ("library", "is_model", "functions"),
    [
        ("cnn_b4.so", True, ["main"]),
        ("cnn_b1.so", True, ["main"]),
        ("mlp.so", True, ["forward"]),
        ("two_outputs.so", True, ["main"]),
        ("onnx_model.so", True, ["main"]),
        ("ffifuncs.so", False, None),
        ("testfuncs.so", False, None),
    ],
)
def test_is_model_and_functions(models_dir: Path, modules_dir: Path, library: str, is_model: bool, functions: list[str]) -> None:
    folder = modules_dir if library in ("ffifuncs.so", "testfuncs.so") else models_dir
    module = tf_op.Module(folder / library)
    assert module.is_model is is_model
    if functions is None:  # a library of plain functions: its exports (test_module_errors.py)
        assert "add_one" in module.functions() or "identity" in module.functions()
    else:
        assert module.functions() == functions


def test_a_library_removed_since_is_not_a_model(tmp_path: Path, modules_dir: Path) -> None:
    path = tmp_path / "removed.so"
    shutil.copy(modules_dir / "testfuncs.so", path)
    module = tf_op.Module(path)
    path.unlink()
    assert module.is_model is False and module.functions() == []


def test_tvm_compiler_is_not_in_this_process() -> None:
    """The models were built in subprocesses; TVM's compiler (and its LLVM) must
    not share a process with TensorFlow."""
    assert "tvm" not in sys.modules


#: Loads and runs each corrupted copy as tf_op does (Module, then the op),
#: counting outcomes: a copy that crashed would end this process.
_RUN_CORRUPTED = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_op
    outcomes = {}
    for path in sys.argv[1:]:
        try:
            fn = tf_op.Module(path).func("main", output_shapes=[[None, 4], [None, 4], [None]])
            fn(tf.constant(np.ones((2, 4), np.float32)))
            outcome = "ran"
        except ValueError as e:
            outcome = "refused"
        except tf.errors.OpError as e:
            outcome = "failed"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(json.dumps(outcomes))
""")


def test_corrupted_model_executables_never_crash(models_dir: Path, tmp_path: Path) -> None:
    """30 copies of a model with 4 random bytes changed in its serialized Relax
    VM executable, loaded and run: TVM's deserializer dies of some ("Cannot find
    type info", SIGSEGV) and its interpreter of others. The executable is
    verified before TVM's loader reads it (dsoop/vmexecutable.go), so none takes
    the process down."""
    original = (models_dir / "two_outputs.so").read_bytes()
    magics = [m.to_bytes(8, "little") for m in (0xD225DE2F4214151E, 0xD225DE2F4214151D)]
    start = max(original.find(m) for m in magics)
    assert start > 0, "no Relax VM executable in two_outputs.so"
    size = int.from_bytes(original[start - 8 : start], "little")
    rng = np.random.default_rng(0)
    copies = []
    for i in range(30):
        data = bytearray(original)
        for at in rng.integers(start, start + size, size=4):
            data[at] = rng.integers(256)
        copies.append(tmp_path / f"copy{i}.so")
        copies[-1].write_bytes(data)
    done = run_python(_RUN_CORRUPTED, *map(str, copies))
    assert done.returncode == 0, f"a corrupted copy crashed (exit {done.returncode}):\n{done.stderr[-2000:]}"
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(outcomes.values()) == 30, outcomes


#: Makes a Module of each corrupted copy and has the op load it, by calling a
#: function it lacks (the op loads the library, then looks the name up), so that
#: none of the copy's code runs but what loading runs.
_LOAD_CORRUPTED_FUNCTIONS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tf_op
    outcomes = {}
    for path in sys.argv[1:]:
        try:
            tf_op.Module(path).func("no_such_function")(tf.constant([1.0]))
            outcome = "ran"
        except ValueError:
            outcome = "refused"
        except tf.errors.OpError:
            outcome = "failed"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(json.dumps(outcomes))
""")


@pytest.mark.parametrize("probe", ["on", "off"])
def test_corrupted_function_libraries_never_crash_the_load(modules_dir: Path, tmp_path: Path, probe: str) -> None:
    """30 copies of a function library with 6 random bytes changed, each given to
    tf_op.Module without a digest and loaded by the op: Module probes the file in
    a process of its own, so none takes this one down. With the probe off, some
    copies crash the loading process: the test can tell."""
    original = (modules_dir / "testfuncs.so").read_bytes()
    head = 8192  # the ELF and program headers, the dynamic symbols, relocations: what loading reads
    rng = np.random.default_rng(1)
    copies = []
    for i in range(30):
        data = bytearray(original)
        for at in rng.integers(0, head, size=6):
            data[at] = rng.integers(256)
        copies.append(tmp_path / f"copy{i}.so")
        copies[-1].write_bytes(data)
    env = {} if probe == "on" else {"TVMDSOOP_PROBE": "off"}
    done = run_python(_LOAD_CORRUPTED_FUNCTIONS, *map(str, copies), env=env)
    if probe == "off":
        assert done.returncode != 0, "without the probe no copy crashed the load: this test could not fail"
        return
    assert done.returncode == 0, f"a corrupted copy crashed the load (exit {done.returncode}):\n{done.stderr[-2000:]}"
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(outcomes.values()) == 30 and "ran" not in outcomes, outcomes
