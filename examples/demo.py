"""The main job: compile a TVM function, run it inside a TensorFlow graph.

    make demo        (or: .venv/bin/python examples/demo.py)
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "add_one.so"
        # TVM compiles in its own process: its LLVM stays out of TensorFlow's.
        subprocess.run([sys.executable, str(Path(__file__).with_name("build_add_one.py")), str(lib)], check=True)
        print(f"compiled add_one with TVM into {lib.name}")

        add_one = tf_op.Module(lib).func("add_one")

        x = tf.constant([1.0, 2.0, 3.0, 4.0])
        print("input:              ", x.numpy())
        print("eager add_one(x):   ", add_one(x).numpy())

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def graph(t: tf.Tensor) -> tf.Tensor:
            return add_one(t) * 10.0

        print("tf.function 10*add_one(x):", graph(x).numpy())


if __name__ == "__main__":
    main()
