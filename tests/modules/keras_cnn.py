"""Builds the small Keras CNN the whole-model tests and the demo use, and its TFLite forms.

    python keras_cnn.py OUT_DIR [--batch B ...]

The TensorFlow half of the model pipeline: it imports TensorFlow and never TVM
(their LLVMs clash in one process); build_models.py turns the .tflite files into
TVM libraries in another process. Writes OUT_DIR/cnn.keras (the reference the
tests compare with), OUT_DIR/cnn_savedmodel (the same model as a SavedModel, what
the Go TF bindings load: tfbridge.BenchmarkServed) and OUT_DIR/cnn_b{B}.tflite
for each batch size (default 4).
The TFLite route needs a static batch: the TVM frontend compiles fixed shapes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

#: One image, NHWC without the batch: small enough to build and run in seconds.
INPUT_SHAPE: tuple[int, int, int] = (16, 16, 3)
NUM_CLASSES = 10
SEED = 0


def build_model() -> keras.Model:
    """The CNN, with weights drawn from a fixed seed so every run builds the same model.

    Conv, pooling, a reduction and a dense layer: the ops a bridge to TVM must get
    right (layout, padding, broadcasting of biases)."""
    keras.utils.set_random_seed(SEED)
    return keras.Sequential(
        [
            keras.Input(shape=INPUT_SHAPE, name="image"),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 3, padding="valid", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(NUM_CLASSES),
        ],
        name="cnn",
    )


def to_tflite(model: keras.Model, batch: int) -> bytes:
    """The model as a float32 TFLite flatbuffer with a static batch of ``batch``.

    Converted from a concrete function rather than from the Keras model so that the
    batch dimension is fixed; no optimizations, so weights stay float32 and TVM's
    output can match Keras to rounding. No trackable object is passed on purpose:
    with one, the converter keeps the weights as resource variables (VAR_HANDLE /
    READ_VARIABLE ops, which TVM's frontend rejects); without, it freezes them into
    constants."""
    fn = tf.function(lambda x: model(x, training=False))
    concrete = fn.get_concrete_function(tf.TensorSpec((batch, *INPUT_SHAPE), tf.float32, name="image"))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.optimizations = []
    return converter.convert()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--batch", type=int, nargs="+", default=[4], help="static batch sizes (default 4)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model()
    model.save(args.out_dir / "cnn.keras")
    model.export(args.out_dir / "cnn_savedmodel", verbose=False)
    print(f"wrote {args.out_dir / 'cnn.keras'}, {args.out_dir / 'cnn_savedmodel'}")
    for b in args.batch:
        path = args.out_dir / f"cnn_b{b}.tflite"
        path.write_bytes(to_tflite(model, b))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
