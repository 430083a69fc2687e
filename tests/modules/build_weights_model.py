"""Builds the model of the unloading tests: 16 MiB of weights, one library.

    python build_weights_model.py OUT_DIR

Writes, into OUT_DIR:

- ``weights.so``: ``main(x: f32[1,2048]) -> x @ W``, W an f32[2048,2048]
  constant (16 MiB) of the Relax VM executable, so the library carries it;
- ``weights.json``: ``offset``, where W's bytes begin in weights.so, with
  ``rows`` and ``cols``.

A test makes as many versions of the model as it needs from this one build:
it writes a version number into W[0,0] at that offset, and ``main`` of the
one-hot x = e0 returns W's row 0, that number first. The executable stores its
constants raw, with no checksum, so each version is a valid library of its own
(another digest, another W). One compile instead of one per version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm.script import relax as R

ROWS = COLS = 2048


def weights() -> np.ndarray:
    """W: distinct, exactly representable values, so that its bytes are found
    once in the library and a test can tell any element's value."""
    return (np.arange(ROWS * COLS, dtype=np.int64) % 65521).astype(np.float32).reshape(ROWS, COLS)


def build(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = weights()

    @R.function
    def main(x: R.Tensor((1, ROWS), "float32")) -> R.Tensor((1, COLS), "float32"):
        return R.matmul(x, R.const(w))

    mod = tvm.IRModule({"main": main})
    lib = out / "weights.so"
    tvm.compile(mod, target="llvm").export_library(str(lib))
    data = lib.read_bytes()
    raw = w.tobytes()
    offset = data.find(raw)
    if offset < 0 or data.find(raw, offset + 1) >= 0:
        sys.exit(f"{lib}: W's bytes are not there exactly once: the executable's constant layout changed")
    (out / "weights.json").write_text(json.dumps({"offset": offset, "rows": ROWS, "cols": COLS}))


if __name__ == "__main__":
    build(sys.argv[1])
