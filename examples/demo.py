"""The main job: compile with TVM, run inside a TensorFlow graph.

    make demo        (or: .venv/bin/python examples/demo.py)

1. A TVM function: add_one, compiled by TVM, called from TF eagerly and in a graph.
2. A whole model: a small Keras CNN -> TFLite (TF's converter) -> TVM (Relax,
   compiled in its own process) -> one .so -> run inside a tf.function, against
   Keras itself and against TVM's own VM.
3. TVM as a compiler for TF: tf_op.compile on a transformer encoder block, timed
   against TF running the same Keras model, both in a tf.function.
"""

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402

HERE = Path(__file__).resolve().parent
# The model builders the tests use: keras_cnn.py (TF side), build_models.py (TVM side).
MODELS = HERE.parent / "tests" / "modules"
sys.path.insert(0, str(MODELS))

import keras_cnn  # noqa: E402
import keras_transformer  # noqa: E402

BATCH = 4
CALLS = 200

#: Run in the TVM process: compiles the CNN's TFLite form and times TVM's own VM
#: on the same input (the VM called from Python, as TVM's users call it).
TVM_SIDE = """
import sys, time
from pathlib import Path
import numpy as np
import tvm
sys.path.insert(0, sys.argv[1])
import build_models
lib = build_models.build_cnn(Path(sys.argv[2]), Path(sys.argv[3]))
vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
x = tvm.runtime.tensor(np.load(sys.argv[4]))
main = vm["main"]
for _ in range(20):
    main(x)
start = time.perf_counter()
for _ in range(int(sys.argv[5])):
    main(x)
print((time.perf_counter() - start) / int(sys.argv[5]) * 1e6)
"""


def per_call_us(fn: Callable[[], object], calls: int = CALLS) -> float:
    """Microseconds a call, after a warm-up."""
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def tvm_function(tmp: Path) -> None:
    lib = tmp / "add_one.so"
    # TVM compiles in its own process: its LLVM stays out of TensorFlow's.
    subprocess.run([sys.executable, str(HERE / "build_add_one.py"), str(lib)], check=True)
    print(f"compiled add_one with TVM into {lib.name}")

    add_one = tf_op.Module(lib).func("add_one")

    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    print("input:              ", x.numpy())
    print("eager add_one(x):   ", add_one(x).numpy())

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def graph(t: tf.Tensor) -> tf.Tensor:
        return add_one(t) * 10.0

    print("tf.function 10*add_one(x):", graph(x).numpy())


def whole_model(tmp: Path) -> None:
    print(f"\nwhole model: a Keras CNN, batch {BATCH}, input {keras_cnn.INPUT_SHAPE}")
    model = keras_cnn.build_model()
    tflite = tmp / f"cnn_b{BATCH}.tflite"
    tflite.write_bytes(keras_cnn.to_tflite(model, BATCH))
    images = np.random.default_rng(0).standard_normal((BATCH, *keras_cnn.INPUT_SHAPE)).astype(np.float32)
    np.save(tmp / "images.npy", images)
    # TVM's side in its own process: the TFLite frontend, tvm.compile, export_library.
    lib = tmp / f"cnn_b{BATCH}.so"
    tvm_side = subprocess.run(
        [sys.executable, "-c", TVM_SIDE, str(MODELS), str(tflite), str(lib), str(tmp / "images.npy"), str(CALLS)],
        capture_output=True, text=True,
    )
    if tvm_side.returncode != 0:
        sys.exit(f"demo: the TVM build of the CNN failed:\n{tvm_side.stderr[-3000:]}")
    tvm_vm_us = float(tvm_side.stdout.split()[-1])
    print(f"Keras -> TFLite -> TVM (relax.frontend.tflite, tvm.compile, export_library): {lib.name}")

    cnn = tf_op.Module(lib)
    print(f"the library is a whole model: {cnn.is_model}, functions {cnn.functions()}")
    classify = cnn.func("main", output_shape=[BATCH, 10])

    @tf.function(input_signature=[tf.TensorSpec([BATCH, *keras_cnn.INPUT_SHAPE], tf.float32)])
    def tvm_graph(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(classify(x))

    @tf.function(input_signature=[tf.TensorSpec([BATCH, *keras_cnn.INPUT_SHAPE], tf.float32)])
    def keras_graph(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(model(x, training=False))

    x = tf.constant(images)
    diff = np.abs(tvm_graph(x).numpy() - keras_graph(x).numpy()).max()
    print(f"largest difference from Keras (softmax outputs): {diff:.1e}")
    print("classes:", tvm_graph(x).numpy().argmax(axis=1))
    op_us = per_call_us(lambda: tvm_graph(x))
    keras_us = per_call_us(lambda: keras_graph(x))
    print(f"time per batch, a tf.function call each: TVMDSOOp {op_us:.0f} us, Keras {keras_us:.0f} us; "
          f"TVM's own VM (from Python, its own process) {tvm_vm_us:.0f} us")


def compiled_model(tmp: Path) -> None:
    batch = 8
    print(f"\ntf_op.compile: a transformer encoder block, batch {batch}, input {keras_transformer.INPUT_SHAPE}")
    keras.utils.set_random_seed(0)
    model = keras_transformer.build_model()
    spec = [tf.TensorSpec([batch, *keras_transformer.INPUT_SHAPE], tf.float32)]
    start = time.perf_counter()
    # The default target builds every x86-64 level into one library; the op runs
    # the highest this CPU has.
    fast = tf_op.compile(model, spec, cache_dir=tmp / "cache", batch_sizes=[batch])
    print(f"compiled by TVM in {time.perf_counter() - start:.1f} s")
    tvm_graph = tf.function(fast, input_signature=spec)
    tf_graph = tf.function(lambda x: model(x, training=False), input_signature=spec)
    x = tf.constant(np.random.default_rng(0).standard_normal((batch, *keras_transformer.INPUT_SHAPE)), tf.float32)
    want = tf_graph(x).numpy()
    print(f"largest difference from Keras: {np.abs(tvm_graph(x).numpy() - want).max() / np.abs(want).max():.1e} "
          "of the largest output")
    tvm_us = min(per_call_us(lambda: tvm_graph(x), 50) for _ in range(3))
    tf_us = min(per_call_us(lambda: tf_graph(x), 50) for _ in range(3))
    print(f"time per batch, a tf.function call each: tf_op.compile {tvm_us:.0f} us, TensorFlow {tf_us:.0f} us "
          f"({tf_us / tvm_us:.1f}x)")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tvm_function(Path(tmp))
        whole_model(Path(tmp))
        compiled_model(Path(tmp))


if __name__ == "__main__":
    main()
