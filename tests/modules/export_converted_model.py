"""Converts a small Keras CNN's SavedModel with tf_op.auto.convert, for the
runtimes that load it without a TVM compiler (the Go tests).

    python export_converted_model.py OUT_DIR

Writes OUT_DIR/model (the converted SavedModel, compiled ahead for a batch of
2 images of 16x16x3) and OUT_DIR/expected.json: the input it was compiled and
checked with, its shape and the Keras model's logits for it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402


class Served(tf.Module):
    def __init__(self, model: keras.Model) -> None:
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 3], tf.float32, name="images")])
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"logits": self.model(images, training=False)}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(4)(x))
    served = Served(model)
    tf.saved_model.save(served, str(out / "saved"), signatures={"serving_default": served.serve})
    images = np.random.default_rng(0).random((2, 16, 16, 3), dtype=np.float32)
    clusters = tf_op.auto.convert(out / "saved", out / "model", [{"images": images}], cache_dir=out / "cache",
                                  timing_fallback=False)
    if not clusters or any(s.status != "tvm" for c in clusters for s in c.shape_records):
        raise SystemExit(f"the conversion compiled nothing to run on TVM: {clusters}")
    shutil.rmtree(out / "cache")  # the converted model brings its libraries
    logits = model(images, training=False).numpy()
    (out / "expected.json").write_text(json.dumps({"x": images.ravel().tolist(), "shape": list(images.shape),
                                                   "logits": logits.ravel().tolist()}))


if __name__ == "__main__":
    main(sys.argv[1])
