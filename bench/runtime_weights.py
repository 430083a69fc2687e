"""Constant weights against runtime weights: the same Keras model compiled twice.

    python bench/runtime_weights.py build DIR [MODEL ...]     # TF: the two TFLite models, inputs, Keras's outputs
    python bench/runtime_weights.py compile DIR [MODEL ...]   # TVM worker: each .tflite to a .so (native target)
    python bench/runtime_weights.py time DIR [ROUNDS] [MODEL ...]  # TF: check and time both libraries, in turns

With BEFORE=DIR2 in the environment, ``time`` also times DIR2's libraries of the
same names (compiled by another version of the worker) in the same turns.

(a) ``const``: weights frozen as constants, as ``tf_op.compile`` converts a model.
(b) ``input``: the weights as the function's inputs (Keras 3's ``stateless_call``),
as ``tf_op.auto``'s clusters get them: Keras weights are variables, read in TF.
Run each stage on the repository's Python with PYTHONPATH=python and
TVMDSOOP_LIBRARY set; pin with ``taskset`` for timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
#: Each model: bench/peers.py's builder and the input's shape.
MODELS = {"cnn": ("cnn", (1, 32, 32, 3)), "transformer": ("transformer", (1, 64, 128)),
          "transformer_b8": ("transformer", (8, 64, 128)), "mobilenetv2": ("mobilenetv2", (1, 224, 224, 3)),
          "resnet50": ("resnet50", (1, 224, 224, 3))}


def _keras_model(name: str) -> Any:
    import keras

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
    from bench.peers import BUILDERS

    keras.utils.set_random_seed(0)
    model = BUILDERS[MODELS[name][0]]()
    # Random batch norm statistics: Keras's initial ones (0 and 1) would hide a
    # mean or variance read wrongly.
    rng = __import__("numpy").random.default_rng(1)
    for var in model.non_trainable_variables:
        value = var.numpy()
        var.assign(rng.uniform(0.5, 1.5, value.shape).astype(value.dtype) if "variance" in var.path
                   else rng.normal(0, 0.1, value.shape).astype(value.dtype))
    return model


def build(folder: Path, names: list[str]) -> None:
    import numpy as np
    import tensorflow as tf

    from tf_op.compiler.tflite_conversion import to_tflite

    for name in names:
        model = _keras_model(name)
        shape = MODELS[name][1]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        spec = tf.TensorSpec(shape, tf.float32)
        const = tf.function(lambda t: model(t, training=False)).get_concrete_function(spec)
        trainable = [v.numpy() for v in model.trainable_variables]
        non_trainable = [v.numpy() for v in model.non_trainable_variables]
        weights = trainable + non_trainable
        split = len(trainable)

        def stateless(t: Any, *w: Any) -> Any:
            return model.stateless_call(list(w[:split]), list(w[split:]), t, training=False)[0]

        specs = [tf.TensorSpec(w.shape, tf.float32) for w in weights]
        runtime = tf.function(stateless).get_concrete_function(spec, *specs)
        (folder / f"{name}_const.tflite").write_bytes(to_tflite(const, name))
        (folder / f"{name}_input.tflite").write_bytes(to_tflite(runtime, name))
        expected = model(x, training=False).numpy()
        # The TFLite model's inputs in its own order (the converter may reorder them).
        interpreter = tf.lite.Interpreter(model_path=str(folder / f"{name}_input.tflite"))
        order = [int(d["name"].rsplit("_", 1)[-1].split(":")[0]) if d["name"] != "t" and "_" in d["name"] else -1
                 for d in interpreter.get_input_details()]
        np.savez(folder / f"{name}.npz", x=x, expected=expected, order=np.array(order),
                 **{f"w{i}": w for i, w in enumerate(weights)})
        print(name, "inputs:", len(order), "output", expected.shape, flush=True)


def compile_all(folder: Path, names: list[str]) -> None:
    worker = ROOT / "python" / "tf_op_tvm" / "compile_model.py"
    target = subprocess.run([sys.executable, str(worker), "--host-target"], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    for name in names:
        for kind in ("const", "input"):
            start = time.perf_counter()
            result = subprocess.run([sys.executable, str(worker), str(folder / f"{name}_{kind}.tflite"),
                                     str(folder / f"{name}_{kind}.so"), target], capture_output=True, text=True)
            log = [line for line in result.stderr.splitlines() if line.startswith("tvmdsoop:")]
            print(name, kind, f"{time.perf_counter() - start:.1f} s", *log, sep="\n  ", flush=True)
            if result.returncode:
                print(result.stderr[-3000:])


def _bound(func: Any, args: list[Any]) -> Any:
    """``func(*args)`` as a tf.function of no arguments: ``args`` are captured,
    as a graph's variables are. Passed as arguments instead, tf.function's
    dispatch costs about 10 µs each per call (ResNet50: 321 of them)."""
    import tensorflow as tf

    return tf.function(lambda: func(*args))


def time_all(folder: Path, rounds: int, names: list[str], before: Path | None) -> None:
    import numpy as np
    import tensorflow as tf

    import tf_op

    for name in names:
        data = np.load(folder / f"{name}.npz")
        x, expected, order = data["x"], data["expected"], list(data["order"])
        # Variables, as the weights of a model: the op gets them through ReadVariableOp.
        weights = [tf.Variable(data[f"w{i}"]) for i in range(len(order) - 1)]
        xt = tf.constant(x)
        calls: dict[str, Callable[[], Any]] = {}
        for label, libraries in (("", folder), ("before_", before)):
            for kind in ("const", "input"):
                if libraries is None:
                    continue
                func = tf_op.Module(str(libraries / f"{name}_{kind}.so")).func(
                    "main", output_shapes=[list(expected.shape)], output_dtypes=[tf.float32])
                args = [xt] if kind == "const" else [xt if i < 0 else weights[i] for i in order]
                calls[label + kind] = _bound(func, args)
        # What TF alone spends feeding the weights to one op (a ReadVariableOp
        # each): part of any runtime-weight call, whatever the library does.
        calls["reads"] = tf.function(lambda: tf.raw_ops.IdentityN(input=[xt, *weights])[0])
        times: dict[str, list[float]] = {kind: [] for kind in calls}
        for kind, call in calls.items():
            if kind == "reads":
                continue
            got = call()
            got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
            error = np.abs(got - expected).max() / np.abs(expected).max()
            print(f"{name} {kind}: relative error {error:.2e}", "OK" if error <= 1e-4 else "WRONG", flush=True)
        for turn in range(rounds):  # in turns: a slow spell of the shared machine falls on all
            # Every other round backwards: what runs just before a library (a
            # big model's weights through the caches) is not always the same.
            for kind, call in (calls.items() if turn % 2 else reversed(calls.items())):
                call()
                n, start = 0, time.perf_counter()
                while n < 3 or time.perf_counter() - start < 0.3:
                    call()
                    n += 1
                times[kind].append((time.perf_counter() - start) / n * 1e3)
        medians = {f"{kind}_ms": round(float(np.median(t)), 3) for kind, t in times.items()}
        print(json.dumps({"model": name, **medians, "ratio": round(medians["input_ms"] / medians["const_ms"], 3)}),
              flush=True)


def main(argv: list[str]) -> None:
    stage, folder, rest = argv[0], Path(argv[1]), argv[2:]
    folder.mkdir(parents=True, exist_ok=True)
    if stage == "time":
        rounds = int(rest.pop(0)) if rest and rest[0].isdigit() else 7
        before = os.environ.get("BEFORE")
        time_all(folder, rounds, rest or list(MODELS), Path(before) if before else None)
    else:
        {"build": build, "compile": compile_all}[stage](folder, rest or list(MODELS))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1:])
