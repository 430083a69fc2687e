"""What the benchmark scripts share: paths, sizes and goals. Imports neither TensorFlow nor TVM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

#: A benchmark's figures by key, as build/bench/results.json holds them.
Results = dict[str, float | int | str]
ROOT: Final = Path(__file__).resolve().parent.parent
BENCH_DIR: Final = ROOT / "bench"
BUILD_DIR: Final = ROOT / "build" / "bench"
LIBRARY: Final = BUILD_DIR / "add_one.so"  # examples/build_add_one.py
#: The Keras CNN (tests/modules/keras_cnn.py, build_models.py): cnn.keras, cnn_savedmodel, cnn_b{B}.so.
MODELS_DIR: Final = BUILD_DIR / "models"
VM_DIRECT: Final = BUILD_DIR / "libvm_direct.so"  # bench/vm_direct.c, built by make build
DEFOPS: Final = BUILD_DIR / "defops.so"  # tests/modules/defops.py, by python -m tf_op_tvm.build_ops
DEFOP_SIZE: Final = 2048  # the fused defop's operands: DEFOP_SIZE x DEFOP_SIZE float32
RESULTS: Final = BUILD_DIR / "results.json"
#: The report: hand-written prose; the part between RESULTS_MARKERS is generated.
DOC, PLOT, PEERS_PLOT = (ROOT / "docs" / name for name in ("benchmarks.md", "benchmarks.png", "benchmarks_peers.png"))
RESULTS_MARKERS: Final = ("<!-- results: written by make bench (bench/report.py) -->", "<!-- end of results -->")
#: The GPU figures, recorded by `make test-gpu` on a GPU machine (docs/gpu.md).
GPU_RESULTS: Final = ROOT / "docs" / "gpu_results.json"
CHAIN: Final = 50  # applications of add-one per tf.function call in the per-op comparisons
PER_OP_CHAIN, PER_OP_PERCENTILE, PER_OP_SINGLE_CALLS = 400, 20, 200  # the headline per-op slopes (docs/benchmarks.md)
PY_FUNCTION_SIZE: Final = 1024
LARGE_SIZES: Final = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}  # float32 elements
LARGE_KEY_SIZE: Final = "16M"  # the size of the headline keys
#: The large-tensor ratios: key, numerator, denominator (each at every size).
LARGE_RATIOS: Final = (("ratio_vs_direct_tvm", "tvmdsoop", "direct_tvm"),
                ("graph_ratio_vs_direct_tvm", "tvmdsoop_graph", "direct_tvm"),
                ("tf_add_graph_ratio_vs_direct_tvm", "tf_add_graph", "direct_tvm"),
                ("first_touch_ratio", "direct_tvm_fresh_out", "direct_tvm"),
                ("graph_ratio_vs_direct_tvm_fresh_out", "tvmdsoop_graph", "direct_tvm_fresh_out"),
                ("old_way_ratio_vs_tvmdsoop", "old_way", "tvmdsoop"))
MEMORY_SIZE: Final = 64 << 20  # 256 MiB of float32
MODEL_BATCHES: Final = (1, 32)  # of the whole-model and bridge comparisons
MODEL_CHAIN: Final = 50  # model calls per tf.function call (and 1: the slope is one call)
SERVED_WORKLOADS: Final = ("matmul", "model_b1", "model_b32")  # tfbridge.BenchmarkServed's keys
SERVED_CALLERS: Final = (1, 2, 8)
BRIDGE_MODELS: Final = ("mlp", "cnn", "mobilenetv2", "tf_function")  # compare.py bridge, in report order
BRIDGE_CACHE: Final = BUILD_DIR / "bridge_cache"  # emptied at each run
#: The peers (compare.py peers, bench/peers.py): each model's batches, in report order; QUICK runs only the first three.
PEERS_MODELS: Final = {"cnn": (1, 32), "transformer": (1, 8), "lstm": (1, 8), "mobilenetv2": (1, 8),
                       "resnet50": (1, 8), "efficientnetb0": (1,), "bert_layer": (1,)}
PEERS_QUICK: Final = ("cnn", "transformer", "lstm")
#: Its engines, in report order, with their column names; "tvm_tuned" only with --tune.
PEERS_ENGINES: Final = {"tf": "TF graph", "xla": "XLA (jit_compile)", "tflite": "TFLite + XNNPACK",
                        "ort": "ONNX Runtime (tf2onnx)", "tvm": "tf_op.compile", "tvm_eager": "tf_op.compile, eager",
                        "tvm_tuned": "tf_op.compile tuned", "tvm_tuned_eager": "tf_op.compile tuned, eager",
                        "auto": "tf_op.auto"}
#: The engines ours is compared with directly, round by round (what users would pick instead of TF).
PEERS_RIVALS: Final = ("tflite", "ort")
PEERS_TOLERANCE: Final = 1e-4  # of float32 engines: max |engine - TF| / max |TF|
PEERS_CACHE: Final = BUILD_DIR / "peers_cache"  # emptied at each run
#: TVM beside TF as the op library sets it (dsoop.c; docs/compiler.md, Threads): all CPUs, as TF's kernels; idle
#: workers spin 200 yields (about 80 us) before they sleep.
TVM_BESIDE_TF: Final = {"TVM_NUM_THREADS": str(len(os.sched_getaffinity(0))), "TVM_THREAD_POOL_SPIN_COUNT": "200"}
#: Each key's goal: (comparison, bound). The tuned bridge keys exist only with --tune.
GOALS: Final[dict[str, tuple[str, float]]] = {
    "per_op_ratio_vs_tf_add": ("<=", 1.25),
    "eager_ratio_vs_tf_add": ("<=", 1.0),
    "go_session_ratio_vs_tf_add": ("<=", 1.25),
    "large_ratio_vs_direct_tvm": ("<=", 1.05),
    "large_graph_ratio_vs_direct_tvm": ("<=", 1.05),
    "speedup_vs_py_function": (">=", 10.0),
    "peak_rss_ratio_vs_tf_add": ("<=", 1.10),
    "model_ratio_vs_tvm_vm": ("<=", 1.05),
    "bridge_ratio_vs_tf_cnn_b1": (">=", 1.5),
    **{f"bridge_tuned_ratio_vs_tf_{m}_b{b}": (">=", 1.0) for m in BRIDGE_MODELS for b in MODEL_BATCHES},
    "bridge_tuned_ratio_vs_tf_mobilenetv2_b1": (">=", 1.3),
    "served_ratio_vs_direct_matmul_n8": (">=", 0.9),
    "served_ratio_vs_direct_model_b32_n8": (">=", 0.9),
    "defop_fused_ratio": (">=", 1.2),
    "gpu_call_overhead_us": ("<=", 3.0),
    "gpu_bw_ratio_vs_d2d": (">=", 0.85),
}


def goal_met(key: str, value: float) -> bool:
    op, bound = GOALS[key]
    return value <= bound if op == "<=" else value >= bound
