"""What the benchmark scripts share: paths, sizes and goals. Imports neither TensorFlow nor TVM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
BENCH_DIR: Final = ROOT / "bench"
BUILD_DIR: Final = ROOT / "build" / "bench"
#: The demo's add-one (examples/build_add_one.py), built once per change of that script.
LIBRARY: Final = BUILD_DIR / "add_one.so"
#: The Keras CNN (tests/modules/keras_cnn.py, then build_models.py): cnn.keras, cnn_savedmodel, cnn_b{B}.so.
MODELS_DIR: Final = BUILD_DIR / "models"
#: TVM's VM called from a C loop (bench/vm_direct.c), built by CMake (make build).
VM_DIRECT: Final = BUILD_DIR / "libvm_direct.so"
RESULTS: Final = BUILD_DIR / "results.json"
#: The report: its prose is hand-written; the part between RESULTS_MARKERS is generated.
DOC: Final = ROOT / "docs" / "benchmarks.md"
PLOT: Final = ROOT / "docs" / "benchmarks.png"
RESULTS_MARKERS: Final = ("<!-- results: written by make bench (bench/report.py) -->", "<!-- end of results -->")
#: The GPU figures, recorded by `make test-gpu` on a GPU machine (docs/gpu.md).
GPU_RESULTS: Final = BENCH_DIR / "gpu_results.json"

#: Applications of add-one per tf.function call in the per-op comparisons.
CHAIN: Final = 50
PY_FUNCTION_SIZE: Final = 1024
#: The large-tensor sizes in float32 elements; the headline keys are at LARGE_KEY_SIZE.
LARGE_SIZES: Final = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}
LARGE_KEY_SIZE: Final = "16M"
#: The memory benchmark's tensor: 256 MiB of float32.
MEMORY_SIZE: Final = 64 << 20
#: Batches of the whole-model and bridge comparisons; the model's headline keys take the worse.
MODEL_BATCHES: Final = (1, 32)
#: Model calls per tf.function call in the whole-model comparison (and 1: the slope is one call).
MODEL_CHAIN: Final = 50
#: tfbridge.BenchmarkServed's workloads and numbers of concurrent callers, as its keys name them.
SERVED_WORKLOADS: Final = ("matmul", "model_b1", "model_b32")
SERVED_CALLERS: Final = (1, 2, 8)
#: What the bridge comparison compiles with tf_op.compile (compare.py bridge_models), in report order.
BRIDGE_MODELS: Final = ("mlp", "cnn", "mobilenetv2", "tf_function")
#: The bridge comparison's compile cache, emptied at each run.
BRIDGE_CACHE: Final = BUILD_DIR / "bridge_cache"

#: Each key's goal: (comparison, bound). Tuned bridge keys (issue 15) exist only with --tune.
GOALS: Final[dict[str, tuple[str, float]]] = {
    "per_op_ratio_vs_tf_add": ("<=", 1.25),
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
    "gpu_call_overhead_us": ("<=", 3.0),
    "gpu_bw_ratio_vs_d2d": (">=", 0.85),
}


def goal_met(key: str, value: float) -> bool:
    op, bound = GOALS[key]
    return value <= bound if op == "<=" else value >= bound


def quiet_tensorflow() -> None:
    """Silences TensorFlow's C++ start-up logging; call before importing it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
