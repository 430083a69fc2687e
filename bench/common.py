"""What the benchmark scripts share: paths, sizes, goals and small helpers.

Importing this module imports neither TensorFlow nor TVM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

ROOT: Final = Path(__file__).resolve().parent.parent
BENCH_DIR: Final = ROOT / "bench"
BUILD_DIR: Final = ROOT / "build" / "bench"
LIBRARY: Final = BUILD_DIR / "add_one.so"
#: The whole models (tests/modules/keras_cnn.py, then build_models.py): cnn.keras,
#: cnn_b{B}.tflite and the Relax VM libraries cnn_b{B}.so.
MODELS_DIR: Final = BUILD_DIR / "models"
#: TVM's VM called from a C loop (bench/vm_direct.c), built by CMake (make build).
VM_DIRECT: Final = BUILD_DIR / "libvm_direct.so"
RESULTS: Final = BUILD_DIR / "results.json"
DOC: Final = ROOT / "docs" / "benchmarks.md"
PLOT: Final = ROOT / "docs" / "benchmarks.png"
PROFILE_NOTES: Final = BENCH_DIR / "profile.md"
#: The GPU figures, recorded by `make test-gpu` on a GPU machine (docs/gpu.md):
#: this machine has no GPU, so make bench reports them as recorded.
GPU_RESULTS: Final = BENCH_DIR / "gpu_results.json"

#: Applications of add-one per tf.function call in the per-op comparisons.
CHAIN: Final = 50
#: Elements of the py_function comparison's tensors.
PY_FUNCTION_SIZE: Final = 1024
#: The large-tensor sizes, in float32 elements, by label.
LARGE_SIZES: Final = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}
#: The size whose ratio is the headline key.
LARGE_KEY_SIZE: Final = "16M"
#: Elements of the memory benchmark's tensor: 256 MiB of float32.
MEMORY_SIZE: Final = 64 << 20
#: The Keras CNN's batch sizes in the whole-model comparison; its headline keys
#: take the larger (worse) figure of the two, so a goal met holds at both.
MODEL_BATCHES: Final = (1, 32)
#: Model calls per tf.function call in the whole-model comparison (and 1: the
#: slope between the two is the cost of one call inside a graph).
MODEL_CHAIN: Final = 50

#: The Go served benchmark (tfbridge.BenchmarkServed): its workloads and numbers
#: of concurrent callers, as it names them in its keys.
SERVED_WORKLOADS: Final = ("matmul", "model_b1", "model_b32")
SERVED_CALLERS: Final = (1, 2, 8)

#: What the bridge comparison compiles with tf_op.compile (bench/compare.py
#: bridge_models), in report order; timed at each batch of MODEL_BATCHES.
BRIDGE_MODELS: Final = ("mlp", "cnn", "mobilenetv2", "tf_function")
#: The compile cache of the bridge comparison, emptied at each run.
BRIDGE_CACHE: Final = BUILD_DIR / "bridge_cache"

#: Each key's goal: (comparison, bound). "<=" keys must stay at or below it.
GOALS: Final[dict[str, tuple[str, float]]] = {
    "per_op_ratio_vs_tf_add": ("<=", 1.25),
    "large_ratio_vs_direct_tvm": ("<=", 1.05),
    "large_graph_ratio_vs_direct_tvm": ("<=", 1.05),
    "speedup_vs_py_function": (">=", 10.0),
    "peak_rss_ratio_vs_tf_add": ("<=", 1.10),
    "model_ratio_vs_tvm_vm": ("<=", 1.05),
    "bridge_ratio_vs_tf_cnn_b1": (">=", 1.5),
    "served_ratio_vs_direct_matmul_n8": (">=", 0.9),
    "served_ratio_vs_direct_model_b32_n8": (">=", 0.9),
    "gpu_call_overhead_us": ("<=", 3.0),
    "gpu_bw_ratio_vs_d2d": (">=", 0.85),
}


def goal_met(key: str, value: float) -> bool:
    """Whether ``value`` meets ``key``'s goal."""
    op, bound = GOALS[key]
    return value <= bound if op == "<=" else value >= bound


def quiet_tensorflow() -> None:
    """Silences TensorFlow's C++ start-up logging; call before importing it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def aligned_empty(n: int, alignment: int = 64) -> npt.NDArray[np.float32]:
    """An uninitialised float32 vector whose data is ``alignment``-byte aligned.

    TensorFlow assumes 64-byte aligned buffers: a tensor imported through
    ``tf.experimental.dlpack.from_dlpack`` over a less aligned numpy array is
    accepted, then aborts the process in the first kernel that checks
    (``Check failed: IsAligned()``).
    """
    itemsize = np.dtype(np.float32).itemsize
    raw = np.empty(n + alignment // itemsize, dtype=np.float32)
    offset = (-raw.ctypes.data % alignment) // itemsize
    out = raw[offset : offset + n]
    assert out.ctypes.data % alignment == 0
    return out
