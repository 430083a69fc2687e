"""Exports a SavedModel whose serving signature calls TVM functions through tf_op.

    python export_saved_model.py TESTFUNCS_SO OUT_DIR

Copies the library to OUT_DIR/lib/ and builds the model on that copy, so that
callers can delete it to prove the SavedModel carries its own. Writes the
SavedModel to OUT_DIR/model and, to OUT_DIR/expected.json, the input it was
checked with and the outputs Python computed, for other runtimes (the Go tests,
the static-link program) to compare with.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402


class Model(tf.Module):
    """Holds its TVM functions as plain attributes: that is all it takes for the
    library to travel with the SavedModel."""

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
    (out / "lib").mkdir(parents=True, exist_ok=True)
    private_lib = out / "lib" / Path(lib_path).name
    shutil.copy(lib_path, private_lib)
    model = Model(str(private_lib))
    tf.saved_model.save(model, str(out / "model"), signatures={"serving_default": model.serve})
    x = [1.0, 2.0, 3.0, 4.0]
    result = model.serve(tf.constant(x))
    expected = {"x": x, "y": result["y"].numpy().tolist(), "z": result["z"].numpy().tolist()}
    (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
