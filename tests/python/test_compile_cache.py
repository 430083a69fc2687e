"""tf_op.compile's cache key: the traced function's fingerprint, known before
the TFLite conversion, so that a hit does not convert, and holding every captured
value, so that a hit is never another model's library.

Each test compiles into its own tmp_path cache; the models are small (a compile
takes about 1.5 s, a fresh process about 5 s more).
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python

from tf_op import CompileError, compile
from tf_op.compiler import tflite_conversion

RTOL = ATOL = 1e-5


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)])


def _inputs(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _libraries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*.so"))


def test_a_cache_hit_does_not_convert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """The key comes from the traced function: a second compile of the model finds
    its library without calling TF's TFLite converter (seconds for ResNet50)."""
    model = _mlp()
    x = _inputs(2, 16)
    compile(model, batch_sizes=[2], cache_dir=tmp_path)

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit ran the TFLite converter")

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_concrete_functions", no_conversion)
    with caplog.at_level(logging.INFO, logger="tf_op.compiler"):
        fast = compile(model, batch_sizes=[2], cache_dir=tmp_path)
    assert "cache hit" in caplog.text and "fingerprinted sequential" in caplog.text
    np.testing.assert_allclose(fast(x).numpy(), model(x, training=False).numpy(), rtol=RTOL, atol=ATOL)
    assert len(_libraries(tmp_path)) == 1


def test_same_graph_with_other_weights_is_another_entry(tmp_path: Path) -> None:
    """The same model object with other weights traces to the same graph: only
    the captured variables' values tell the two apart, and each compile must run
    its own weights."""
    model = _mlp()
    x = _inputs(2, 16)
    first = compile(model, batch_sizes=[2], cache_dir=tmp_path)
    expected_first = model(x, training=False).numpy()

    model.set_weights([np.flip(w) * -1.5 for w in model.get_weights()])
    expected_second = model(x, training=False).numpy()
    assert not np.allclose(expected_first, expected_second)
    second = compile(model, batch_sizes=[2], cache_dir=tmp_path)

    assert len(_libraries(tmp_path)) == 2, "other weights hit the first weights' entry"
    np.testing.assert_allclose(second(x).numpy(), expected_second, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(first(x).numpy(), expected_first, rtol=RTOL, atol=ATOL)


def test_fingerprint_holds_captured_variables_and_tensors() -> None:
    """A tf.Variable's value and a captured eager tensor's value are in the
    fingerprint, though neither is in the graph (TF makes constants of captured
    tensors of up to 128 elements only: these have 256)."""
    v = tf.Variable(_inputs(8, 32, seed=1))

    def traced(w: tf.Tensor) -> tuple[str, bytes]:
        fn = tf.function(lambda x: tf.nn.relu(x @ v + x @ w))
        concrete = fn.get_concrete_function(tf.TensorSpec([2, 8], name="x"))
        graph = concrete.graph.as_graph_def().SerializeToString(deterministic=True)
        return tflite_conversion.fingerprint(concrete).digest, graph

    w = tf.constant(_inputs(8, 32, seed=2))
    base, graph = traced(w)
    assert traced(w) == (base, graph)  # deterministic
    other_tensor = traced(tf.constant(_inputs(8, 32, seed=3)))
    v.assign(v * 2.0)
    other_variable = traced(w)
    assert other_tensor[1] == other_variable[1] == graph
    assert len({base, other_tensor[0], other_variable[0]}) == 3


_PROCESS_SCRIPT = textwrap.dedent("""
    import logging, sys
    import keras, numpy as np, tensorflow as tf
    from tf_op import compile
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    keras.utils.set_random_seed(int(sys.argv[2]))
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)])
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    fast = compile(model, cache_dir=sys.argv[1])
    np.testing.assert_allclose(fast(x).numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-5)
""")


def test_a_fresh_process_hits_without_converting_and_other_weights_miss(tmp_path: Path) -> None:
    """A server restart: the same Keras model built the same way in a new process
    loads its library without the TFLite conversion; built with other weights
    (another seed: the same layer names, the same graph), it compiles its own."""
    logs = []
    for seed in (0, 0, 1):
        result = run_python(_PROCESS_SCRIPT, str(tmp_path), str(seed))
        assert result.returncode == 0, result.stderr
        logs.append(result.stderr)
    first, again, other = logs
    assert "TVM compiled" in first and "sequential: converted to TFLite" in first
    assert "cache hit" in again and "to TFLite" not in again and "TVM compiled" not in again
    assert "cache hit" not in other and "TVM compiled" in other
    assert len(_libraries(tmp_path)) == 2


def test_variables_assigned_during_the_conversion_are_a_compile_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The key holds the values fingerprinted before the conversion, which reads
    them again: a variable assigned in between (another thread training) would
    cache a library under the key of weights it does not hold. It is refused."""
    model = _mlp()
    convert = tf.lite.TFLiteConverter.from_concrete_functions

    def assigning_first(*args: object, **kwargs: object) -> tf.lite.TFLiteConverter:
        model.layers[0].kernel.assign(model.layers[0].kernel * 2.0)
        return convert(*args, **kwargs)

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_concrete_functions", assigning_first)
    with pytest.raises(CompileError, match="variables changed while it was compiled"):
        compile(model, batch_sizes=[2], cache_dir=tmp_path)
    assert _libraries(tmp_path) == []
