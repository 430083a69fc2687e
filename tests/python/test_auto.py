"""tf_op.auto: the graph pass that clusters the TVM-able parts of TF graphs, and
the cluster op that compiles each per input shape and falls back to TF.

Each test enables the pass with its own cache folder and disables it after; a
cluster's compile runs ``python -m tf_op.compiler.cluster`` and the TVM worker,
about 4 s for these small models. The values are checked against TF's with the
pass off (the same tf.function traced before enable(), or the Keras model
called eagerly), and the report says where each cluster ran.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python

import tf_op

RTOL = ATOL = 1e-4


@pytest.fixture
def auto_cache(tmp_path: Path) -> Iterator[Path]:
    """A cache folder for the test's compiles; the pass is off again after it."""
    yield tmp_path / "cache"
    tf_op.auto.disable()


def _cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(4)(x))


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).random((batch, 16, 16, 3), dtype=np.float32)


def _tvm_clusters() -> list[tf_op.auto.Cluster]:
    return [c for c in tf_op.auto.report() if c.status == "tvm"]


def test_a_keras_cnn_runs_in_one_tvm_cluster(auto_cache: Path) -> None:
    model = _cnn()
    x = _images(4)
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: model(t, training=False))
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)

    [cluster] = tf_op.auto.report()
    assert cluster.status == "tvm", cluster.reason
    assert {"_FusedConv2D", "MaxPool"} <= set(cluster.ops), cluster.ops
    assert any(op.startswith("_FusedDepthwiseConv2dNative") or op == "DepthwiseConv2dNative" for op in cluster.ops)
    assert any("[4,16,16,3]" in shape for shape in cluster.shapes), cluster.shapes
    assert cluster.compile_seconds > 0
    assert list(auto_cache.glob("*.so")), "the cluster's library is cached like tf_op.compile's"


def test_what_grappler_makes_of_swish_and_residual_adds_stays_in_one_cluster(auto_cache: Path) -> None:
    """Before the pass, grappler turns x * sigmoid(x) into oneDNN's _MklSwish and
    a sum of three tensors into AddN: each split the model into clusters and
    left the work between them to TF."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 4))
    a = keras.layers.Conv2D(4, 3, padding="same", activation="swish")(inputs)
    b = keras.layers.Conv2D(4, 1, activation="relu")(inputs)
    x = keras.layers.Add()([inputs, a, b])
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))
    x = np.random.default_rng(0).random((2, 8, 8, 4), dtype=np.float32)
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: model(t, training=False))
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "tvm", cluster.reason
    assert {"Conv2D", "_FusedConv2D"} & set(cluster.ops) and "MatMul" in "".join(cluster.ops), cluster.ops


@pytest.mark.parametrize("layer", [keras.layers.LSTM(8), keras.layers.LSTM(8, return_sequences=True),
                                   keras.layers.GRU(8), keras.layers.SimpleRNN(8)],
                         ids=["lstm", "lstm-sequences", "gru", "simple-rnn"])
def test_a_recurrent_layer_runs_its_whole_loop_in_one_cluster(auto_cache: Path, layer: keras.layers.Layer) -> None:
    """Before TF lowers the While, the loop pass takes all of it, with the lists
    it steps through, into one cluster: every step runs in one call to TVM. Its
    weights are read ahead of the loop, each call: new values are used."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 5)), layer])
    x = np.random.default_rng(0).random((2, 6, 5), dtype=np.float32)
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: model(t, training=False))
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    [loop] = [c for c in tf_op.auto.report() if "While" in c.ops]
    assert loop.status == "tvm", loop.reason
    assert {"TensorListFromTensor", "TensorListStack"} <= set(loop.ops), loop.ops
    [record] = loop.shape_records
    assert record.flops > 0, "the loop's matmuls, counted over its steps"

    for weight in model.weights:
        weight.assign(weight * 0.5)
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    assert [c.status for c in tf_op.auto.report() if "While" in c.ops] == ["tvm"]


def test_a_loop_body_the_loop_pass_cannot_take_is_one_cluster_inside_its_frame(auto_cache: Path) -> None:
    """A loop the loop pass leaves (its body writes a variable) is lowered by TF;
    its body's ops still join one cluster, called at each step: the cycle check
    does not follow the loop's back edge, and a constant's control edge from
    the loop's frame stays out of the cluster's function."""
    steps = tf.Variable(0.0)
    w = tf.constant(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * 0.5)

    def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        steps.assign_add(1.0)
        return i + 1, tf.tanh(tf.nn.bias_add(tf.matmul(h, w), tf.constant([0.1, 0.2, 0.3, 0.4]))) * h

    def loop(h: tf.Tensor) -> tf.Tensor:
        return tf.while_loop(lambda i, h: i < 5, body, (0, h))[1]

    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    want = x
    for _ in range(5):
        want = np.tanh(want @ w.numpy() + [0.1, 0.2, 0.3, 0.4]) * want
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    np.testing.assert_allclose(tf.function(loop)(x).numpy(), want, rtol=RTOL, atol=ATOL)
    assert steps.numpy() == 5.0
    assert not [c for c in tf_op.auto.report() if "While" in c.ops], tf_op.auto.report()
    [cell] = tf_op.auto.report()
    assert cell.status == "tvm", cell.reason
    assert {"MatMul", "Mul"} <= {op.removeprefix("_Fused") for op in cell.ops}, cell.ops


@pytest.mark.parametrize(("op", "name"), [(tf.math.erfc, "Erfc"), (tf.math.erf, "Erf")])
def test_erfc_and_erf_run_on_tvm_within_float32_noise(auto_cache: Path, op: Callable[[tf.Tensor], tf.Tensor],
                                                      name: str) -> None:
    """TFLite has no Erfc (Keras 3's exact GELU is 0.5 x erfc(-x / sqrt 2)), and
    Erf only in GELU's pattern: the compile worker builds them of ops TFLite
    has (Abramowitz and Stegun 7.1.26)."""
    z = np.linspace(-6, 6, 64, dtype=np.float32).reshape(8, 8)
    eye = tf.constant(np.eye(8, dtype=np.float32))
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: op(tf.matmul(t, eye)) * 1.0)
    np.testing.assert_allclose(run(z).numpy(), op(z).numpy(), rtol=0, atol=5e-7)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "tvm", cluster.reason
    assert name in cluster.ops, cluster.ops


def test_an_einsum_is_clustered(auto_cache: Path) -> None:
    w = tf.constant(np.random.default_rng(0).random((8, 4), dtype=np.float32))
    x = np.random.default_rng(1).random((2, 3, 8), dtype=np.float32)
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: tf.nn.relu(tf.einsum("bij,jk->bik", t, w) - 2.0))
    np.testing.assert_allclose(run(x).numpy(), np.maximum(np.einsum("bij,jk->bik", x, w.numpy()) - 2.0, 0),
                               rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "tvm", cluster.reason
    assert "Einsum" in cluster.ops, cluster.ops


def test_an_op_tvm_cannot_take_stays_tf_and_splits_the_graph(auto_cache: Path) -> None:
    keras.utils.set_random_seed(1)
    first, second = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(8, activation="tanh")
    x = np.random.default_rng(0).random((4, 12), dtype=np.float32)
    first(x), second(x[:, :1].repeat(16, axis=1))  # build both

    def model(t: tf.Tensor) -> tf.Tensor:
        hidden = first(t)
        # No TVM for these: a Python function, and a sort (TopKV2).
        hidden = tf.py_function(lambda h: h * 2.0, [hidden], tf.float32)
        hidden = tf.sort(tf.ensure_shape(hidden, [4, 16]), axis=-1)
        return second(hidden)

    expected = model(tf.constant(x)).numpy()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False, min_cluster_size=1)
    np.testing.assert_allclose(tf.function(model)(x).numpy(), expected, rtol=RTOL, atol=ATOL)
    clusters = _tvm_clusters()
    assert len(clusters) == 2, tf_op.auto.report()
    assert all("EagerPyFunc" not in c.ops and "TopKV2" not in c.ops for c in clusters)


def test_a_batch_matmul_by_a_variable_compiles_with_the_variable_as_an_input(auto_cache: Path) -> None:
    """A (batch, seq, features) by (features, units) matmul is a BatchMatMulV2
    whose second operand, a variable, is an input of the cluster: TVM's TFLite
    frontend failed to import it until compile_model.py read the operand's shape
    after normalising (the attention's projections in a Keras transformer)."""
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.random((8, 16), dtype=np.float32))
    x = rng.random((2, 6, 8), dtype=np.float32)

    def project(t: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.matmul(t, w) + 1.0)

    expected = project(tf.constant(x)).numpy()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    np.testing.assert_allclose(tf.function(project)(x).numpy(), expected, rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "tvm", cluster.reason
    assert "BatchMatMulV2" in cluster.ops, cluster.ops


def test_a_failed_compile_runs_tf_and_says_why(auto_cache: Path) -> None:
    model = _cnn()
    x = _images(2)
    run = tf.function(lambda t: model(t, training=False))
    tf_op.auto.enable(cache_dir=auto_cache, compile_timeout_s=0.01)
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "tf"
    assert "compile_timeout_s" in cluster.reason, cluster.reason


def test_a_compiled_shape_is_timed_against_tf_before_it_is_kept(auto_cache: Path) -> None:
    model = _cnn()
    x = _images(2)
    expected = model(x, training=False).numpy()
    tf_op.auto.enable(cache_dir=auto_cache)
    run = tf.function(lambda t: model(t, training=False))
    # Six timed runs of TF and six of TVM's code, in turns (one of each warms up).
    for _ in range(11):
        np.testing.assert_allclose(run(x).numpy(), expected, rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status == "timing"
    np.testing.assert_allclose(run(x).numpy(), expected, rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert cluster.status in ("tvm", "tf")
    assert cluster.status == "tvm" or "slower than TF" in cluster.reason, cluster.reason


def test_shapes_past_max_shapes_run_tf(auto_cache: Path) -> None:
    model = _cnn()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False, max_shapes=1)
    run = tf.function(lambda t: model(t, training=False), input_signature=[tf.TensorSpec([None, 16, 16, 3])])
    for batch in (2, 3):
        x = _images(batch)
        np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert [r.status for r in cluster.shape_records] == ["tvm", "tf"], cluster.shape_records
    assert "max_shapes" in cluster.shape_records[1].reason


def test_disable_sends_the_clusters_back_to_tf(auto_cache: Path) -> None:
    model = _cnn()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    run = tf.function(lambda t: model(t, training=False), input_signature=[tf.TensorSpec([None, 16, 16, 3])])
    run(_images(2))
    assert len(_tvm_clusters()) == 1
    tf_op.auto.disable()
    x = _images(5)  # a shape the cluster has not seen: with the pass off, no compile
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    [cluster] = tf_op.auto.report()
    assert len(cluster.shape_records) == 1, cluster.shape_records


def test_the_same_model_traced_again_hits_the_cache(auto_cache: Path) -> None:
    """Each trace makes a cluster of its own; their functions are the same
    (inputs, outputs and nodes in the order of their names, whatever the
    graph's node ids), so the second compile finds the first's library."""
    model = _cnn()
    x = _images(2)
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    for _ in range(2):
        run = tf.function(lambda t: model(t, training=False))
        np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    first, second = tf_op.auto.report()
    assert first.status == second.status == "tvm", (first.reason, second.reason)
    assert first.shape_records[0].library == second.shape_records[0].library
    assert len(list(auto_cache.glob("*.so"))) == 1


def test_a_corrupted_cache_entry_is_compiled_again(tmp_path: Path) -> None:
    """A library in the cache that no longer matches its recorded digest is
    compiled again (by the next process, which finds the same entry)."""
    script = textwrap.dedent("""
        import json, numpy as np, tensorflow as tf, keras
        import tf_op
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
        x = np.random.default_rng(0).random((2, 16, 16, 3), dtype=np.float32)
        tf_op.auto.enable(cache_dir=%r, timing_fallback=False)
        y = tf.function(lambda t: model(t, training=False))(x)
        np.testing.assert_allclose(y.numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)
        [cluster] = tf_op.auto.report()
        [shape] = cluster.shape_records
        print(json.dumps([shape.status, shape.reason, shape.library, shape.sha256]))
    """ % str(tmp_path / "cache"))

    def run() -> list[str]:
        result = run_python(script)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    status, reason, library, _ = run()
    assert status == "tvm", reason
    Path(library).write_bytes(b"\x7fELF" + bytes(64))  # what a full disk or a careless hand may leave
    status, reason, again, digest = run()
    assert status == "tvm", reason
    assert again == library, "the same entry"
    assert hashlib.sha256(Path(library).read_bytes()).hexdigest() == digest, "compiled again, whole"


def test_functions_given_to_xla_are_left_to_xla(auto_cache: Path) -> None:
    model = _cnn()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    x = _images(2)
    run = tf.function(lambda t: model(t, training=False), jit_compile=True)
    np.testing.assert_allclose(run(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    assert tf_op.auto.report() == []


def test_keras_fit_trains_as_it_does_without_the_pass(auto_cache: Path) -> None:
    x = _images(8)
    y = np.random.default_rng(1).random((8, 4), dtype=np.float32)

    def losses() -> list[float]:
        model = _cnn(seed=3)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model.fit(x, y, epochs=3, batch_size=4, shuffle=False, verbose=0).history["loss"]

    expected = losses()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    np.testing.assert_allclose(losses(), expected, rtol=1e-4)
    training = [c for c in _tvm_clusters() if "MatMul" in c.ops]  # the Dense layer's gradient
    assert training, tf_op.auto.report()


def test_an_lstm_trains_and_predicts_as_it_does_without_the_pass(auto_cache: Path) -> None:
    """Training's loops (which keep each step for the gradient, and pop them in
    the backward loop) stay TF's; their bodies cluster. predict's loop is one
    cluster."""
    x = np.random.default_rng(0).random((8, 6, 5), dtype=np.float32)
    y = np.random.default_rng(1).random((8, 3), dtype=np.float32)

    def fit_and_predict() -> tuple[list[float], np.ndarray]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6, 5)), keras.layers.LSTM(8), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        losses = model.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0).history["loss"]
        return losses, model.predict(x, batch_size=8, verbose=0)

    expected_losses, expected = fit_and_predict()
    tf_op.auto.enable(cache_dir=auto_cache, timing_fallback=False)
    losses, predicted = fit_and_predict()
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4)
    np.testing.assert_allclose(predicted, expected, rtol=RTOL, atol=ATOL)
    loops = [c for c in tf_op.auto.report() if "While" in c.ops]
    assert [c.status for c in loops] == ["tvm"], tf_op.auto.report()


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="min_cluster_size must be at least 1"):
        tf_op.auto.enable(min_cluster_size=0)
    with pytest.raises(ValueError, match="max_shapes must be at least 1"):
        tf_op.auto.enable(max_shapes=0)


def test_the_environment_turns_the_pass_on_without_python_and_it_says_what_is_missing(tmp_path: Path) -> None:
    """TVMDSOOP_AUTO=1 is for programs that only load the op library; with no
    TVMDSOOP_AUTO_PYTHON there is no compiler, and TF runs every cluster."""
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        import tf_op
        w = tf.constant(np.random.default_rng(0).random((8, 4), dtype=np.float32))
        run = tf.function(lambda x: tf.nn.relu(tf.matmul(x, w) + 1.0))
        x = np.ones((2, 8), np.float32)
        np.testing.assert_allclose(run(x).numpy(), np.maximum(x @ w.numpy() + 1.0, 0), rtol=1e-5)
        [cluster] = tf_op.auto.report()
        print(cluster.status, "|", cluster.reason)
    """)
    result = run_python(script, env={"TVMDSOOP_AUTO": "1", "TVMDSOOP_AUTO_PYTHON": "", "TVMDSOOP_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    status, reason = result.stdout.strip().splitlines()[-1].split(" | ")
    assert status == "tf"
    assert "TVMDSOOP_AUTO_PYTHON" in reason


def test_mirrored_strategy_on_two_cpus(tmp_path: Path) -> None:
    """A replicated step (two logical CPUs, so two replicas) with the pass on
    gives the values it gives without it."""
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf, keras
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import tf_op
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(4)])
        x = np.random.default_rng(0).random((8, 8), dtype=np.float32)

        @tf.function
        def step(batch):
            return strategy.run(lambda t: model(t, training=False), args=(batch,))

        def run():
            batches = strategy.experimental_distribute_values_from_function(
                lambda ctx: x[ctx.replica_id_in_sync_group * 4:][:4])
            return np.concatenate([t.numpy() for t in strategy.experimental_local_results(step(batches))])

        expected = model(x).numpy()
        tf_op.auto.enable(cache_dir=%r, timing_fallback=False)
        step = tf.function(step.python_function)
        np.testing.assert_allclose(run(), expected, rtol=1e-4, atol=1e-4)
        print(sorted(c.status for c in tf_op.auto.report()))
    """ % str(tmp_path))
    result = run_python(script)
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = eval(result.stdout.strip().splitlines()[-1])  # noqa: S307 - our own script's list
    assert statuses and set(statuses) == {"tvm"}, statuses
