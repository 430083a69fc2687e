"""tf_op.auto.convert: a SavedModel whose clusters are compiled ahead, run where
no TVM compiler is.

The conversion runs here (it compiles: about 5 s a shape for the portable
libraries of this small model); the converted model is loaded in a fresh
process whose TVMDSOOP_TVM_PYTHON names no Python and whose cache is empty, from
a copy in another folder, and checked against the Keras model's values, saved
beside it.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python
from tensorflow.core.protobuf import saved_model_pb2

import tf_op

RTOL = ATOL = 1e-4
BATCHES = (1, 4)


class _Served(tf.Module):
    def __init__(self, model: keras.Model) -> None:
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 3], tf.float32, name="images")])
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"logits": self.model(images, training=False)}


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).random((batch, 16, 16, 3), dtype=np.float32)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[tf_op.auto.Cluster]]]:
    """A Keras CNN saved, then converted for batches 1 and 4 into ``converted/``,
    with the Keras model's logits for batches 1 to 4 in ``expected.npz``."""
    root = tmp_path_factory.mktemp("convert")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(4)(x))
    served = _Served(model)
    tf.saved_model.save(served, str(root / "saved"), signatures={"serving_default": served.serve})
    np.savez(root / "expected.npz", **{str(b): model(_images(b), training=False).numpy() for b in (1, 2, 3, 4)})

    clusters = tf_op.auto.convert(root / "saved", root / "converted", [{"images": _images(b)} for b in BATCHES],
                                  cache_dir=root / "cache", timing_fallback=False)
    shutil.rmtree(root / "cache")  # the converted model brings its libraries
    yield root, clusters


def _serve_elsewhere(root: Path, tmp_path: Path, batches: tuple[int, ...]) -> list[dict[str, str]]:
    """Loads a copy of the converted model in a process with no TVM compiler and
    an empty cache, checks its logits for ``batches``; the report's shapes."""
    moved = tmp_path / "moved"
    shutil.copytree(root / "converted", moved)
    script = textwrap.dedent(f"""
        import json, numpy as np, tensorflow as tf
        import tf_op
        serve = tf.saved_model.load({str(moved)!r}).signatures["serving_default"]
        expected = np.load({str(root / "expected.npz")!r})
        for batch in {batches!r}:
            images = np.random.default_rng(batch).random((batch, 16, 16, 3), dtype=np.float32)
            logits = serve(images=images)["logits"].numpy()
            np.testing.assert_allclose(logits, expected[str(batch)], rtol={RTOL}, atol={ATOL})
        print(json.dumps([{{"shape": s.shape, "status": s.status, "reason": s.reason, "library": s.library}}
                          for c in tf_op.auto.report() for s in c.shape_records]))
    """)
    result = run_python(script, env={"TVMDSOOP_TVM_PYTHON": str(tmp_path / "no-python"),
                                     "TVMDSOOP_CACHE_DIR": str(tmp_path / "empty-cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_convert_compiles_each_example_shape(converted: tuple[Path, list[tf_op.auto.Cluster]]) -> None:
    root, clusters = converted
    assert clusters, "the CNN makes a cluster"
    for cluster in clusters:
        assert {"Conv2D", "MaxPool"} <= set(cluster.ops), cluster.ops
        assert sorted(s.shape.split(" ")[0] for s in cluster.shape_records) == ["[1,16,16,3]", "[4,16,16,3]"]
        assert all(s.status == "tvm" and s.flops > 0 for s in cluster.shape_records), cluster.shape_records
    assets = sorted(p.name for p in (root / "converted" / "assets").iterdir())
    assert assets == sorted({Path(s.library).name for c in clusters for s in c.shape_records})


def test_the_converted_model_runs_its_shapes_on_tvm_without_a_compiler(
        converted: tuple[Path, list[tf_op.auto.Cluster]], tmp_path: Path) -> None:
    root, _ = converted
    shapes = {s["shape"].split(" ")[0]: s for s in _serve_elsewhere(root, tmp_path, (1, 4, 3))}
    for batch in BATCHES:
        shape = shapes[f"[{batch},16,16,3]"]
        assert shape["status"] == "tvm", shape["reason"]
        assert shape["library"].startswith(str(tmp_path / "moved" / "assets")), "the copy's asset, not the original"
    other = shapes["[3,16,16,3]"]
    assert other["status"] == "tf" and "compiled ahead" in other["reason"], other


def test_a_library_changed_after_conversion_is_refused_and_tf_runs(
        converted: tuple[Path, list[tf_op.auto.Cluster]], tmp_path: Path) -> None:
    root, _ = converted
    tampered = tmp_path / "tampered"
    shutil.copytree(root, tampered)
    for library in (tampered / "converted" / "assets").iterdir():
        data = bytearray(library.read_bytes())
        data[len(data) // 2] ^= 0xFF
        library.write_bytes(bytes(data))
    shapes = _serve_elsewhere(tampered, tmp_path, BATCHES)
    assert sorted(s["shape"].split(" ")[0] for s in shapes) == ["[1,16,16,3]", "[4,16,16,3]"]
    for shape in shapes:
        assert shape["status"] == "tf", shape
        assert "refusing a library that is not the one the model was built with" in shape["reason"], shape
        assert "SHA-256" in shape["reason"], shape


def _claim_library_serves(saved_model: Path, batch: int, other: int) -> int:
    """Edits the SavedModel's graph so that each cluster's library compiled for
    ``batch`` claims to serve ``other`` (its ``library_shapes`` entry; the
    library itself, and its SHA-256, stay as they were); returns how many
    entries it changed."""
    model = saved_model_pb2.SavedModel.FromString(saved_model.read_bytes())
    changed = 0
    for meta in model.meta_graphs:
        graph = meta.graph_def
        # The cluster's node is in the signature's function, or in the graph.
        for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
            if node.op != "TVMDSOOpCluster":
                continue
            shapes = node.attr["library_shapes"].list.s
            for i, entry in enumerate(shapes):
                # Each input's shape, "[1,16,16,3]" for the images.
                dims = entry.decode().split(" ")
                if dims[0].startswith(f"[{batch},"):
                    dims[0] = f"[{other}," + dims[0][len(f"[{batch},"):]
                    shapes[i] = " ".join(dims).encode()
                    changed += 1
    saved_model.write_bytes(model.SerializeToString())
    return changed


def test_tvm_code_failing_at_run_time_runs_tf_and_sends_the_shape_to_tf(
        converted: tuple[Path, list[tf_op.auto.Cluster]], tmp_path: Path) -> None:
    # An authentic library, said to serve batch 2 where it was compiled for 1:
    # it loads and verifies, and TVM's VM rejects the batch-2 images at run time.
    root, _ = converted
    lying = tmp_path / "lying"
    shutil.copytree(root, lying)
    assert _claim_library_serves(lying / "converted" / "saved_model.pb", batch=1, other=2) > 0
    # Batch 2 twice (TVM's code fails, then the shape is TF's), then 4 (TVM's still).
    shapes = _serve_elsewhere(lying, tmp_path, (2, 2, 4))
    assert shapes, "the clusters report their shapes"
    for shape in shapes:
        batch = shape["shape"].split(" ")[0]
        if batch == "[2,16,16,3]":
            assert shape["status"] == "tf", shape
            assert shape["reason"].startswith("TVM's code failed at run time: "), shape
            assert shape["library"].startswith(str(tmp_path / "moved" / "assets")), shape
        else:
            assert batch == "[4,16,16,3]" and shape["status"] == "tvm", shape


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"example_inputs": []}, "at least one example input"),
    ({"signature_key": "predict"}, "has no signature 'predict'; it has \\['serving_default'\\]"),
    ({"example_inputs": [{"pixels": _images(1)}]}, "an example has inputs \\['pixels'\\]; the signature takes "
                                                    "\\['images'\\]"),
    ({"example_inputs": [{"images": np.zeros((1, 8, 8, 3), np.float32)}]}, "has shape \\(1, 8, 8, 3\\)"),
])
def test_bad_arguments_are_refused(converted: tuple[Path, list[tf_op.auto.Cluster]], tmp_path: Path,
                                   kwargs: dict[str, object], message: str) -> None:
    root, _ = converted
    arguments: dict[str, object] = {"example_inputs": [{"images": _images(1)}], **kwargs}
    with pytest.raises(ValueError, match=message):
        tf_op.auto.convert(root / "saved", tmp_path / "out", **arguments)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_a_model_with_a_loop_converts_and_serves_tfs_values(tmp_path: Path) -> None:
    """A recurrent layer's loop stays a While when the signature is frozen, for
    the loop pass to take whole (lowered, its frame did not survive the
    converted graph's import: the convert failed). With the signature's batch
    unknown, its tensor lists have no static element shape, which TFLite's
    converter needs: that cluster runs TF, and says so; the Dense compiles."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 5)), keras.layers.LSTM(8), keras.layers.Dense(3)])

    class Served(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 6, 5], tf.float32, name="steps")])
        def serve(self, steps: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"out": self.model(steps, training=False)}

    served = Served()
    tf.saved_model.save(served, str(tmp_path / "saved"), signatures={"serving_default": served.serve})
    x = np.random.default_rng(0).random((2, 6, 5), dtype=np.float32)
    clusters = tf_op.auto.convert(tmp_path / "saved", tmp_path / "converted", [{"steps": x}],
                                  cache_dir=tmp_path / "cache", timing_fallback=False)
    by_op = {("While" in c.ops): c for c in clusters}
    assert by_op[True].status == "tf" and "element_shape" in by_op[True].reason, by_op[True]
    assert by_op[False].status == "tvm", f"{by_op[False].reason}: {by_op[False].shape_records}"

    loaded = tf.saved_model.load(str(tmp_path / "converted")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(steps=tf.constant(x))["out"].numpy(), model(x, training=False).numpy(),
                               rtol=RTOL, atol=ATOL)
