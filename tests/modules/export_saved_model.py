"""Exports a SavedModel whose serving signature calls TVM functions through tf_op.

    python export_saved_model.py TESTFUNCS_SO OUT_DIR

Writes the SavedModel to OUT_DIR/model and, to OUT_DIR/expected.json, the input
it was checked with and the outputs Python computed, for other runtimes (the Go
tests) to compare with.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402


class Model(tf.Module):
    def __init__(self, lib_path: str) -> None:
        super().__init__()
        mod = tf_op.Module(lib_path)
        self._add_one = mod.func("add_one")
        self._row_sum = mod.func("row_sum", output_shape=[tf.constant(2)])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = self._add_one(x) * 2.0
        z = self._row_sum(tf.reshape(y, [2, -1]))
        return {"y": y, "z": z}


def main(lib_path: str, out_dir: str) -> None:
    out = Path(out_dir)
    model = Model(lib_path)
    tf.saved_model.save(model, str(out / "model"), signatures={"serving_default": model.serve})
    x = [1.0, 2.0, 3.0, 4.0]
    result = model.serve(tf.constant(x))
    expected = {"x": x, "y": result["y"].numpy().tolist(), "z": result["z"].numpy().tolist()}
    (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
