"""The GPU path, checked on a CPU-only machine: the GPU kernels are registered in
TensorFlow's kernel registry with the right host-memory inputs, the CUDA
libraries of the GPU harness load and check their arguments, and CUDA code
without a CUDA driver gets a clear error. (Running on a GPU: docs/gpu.md.)"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import tf_op

GPU_BUILD = Path(__file__).resolve().parents[2] / "build" / "gpu"


def _has_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


needs_no_cuda_driver = pytest.mark.skipif(_has_cuda_driver(), reason="checks a machine without a CUDA driver")
#: make's build turns the harness on; a plain CMake build leaves it out.
needs_gpu_harness = pytest.mark.skipif(
    not (GPU_BUILD / "model_harness").is_file(),
    reason="the GPU harness was not built (cmake -DTVMDSOOP_GPU_HARNESS=ON, as make does)",
)


@pytest.mark.parametrize(
    ("op", "host_memory"),
    [("TVMDSOOp", {"output_dims", "library"}), ("TvmDsoOp", {"dynamic_output_shape"})],
)
def test_gpu_kernel_is_registered(op: str, host_memory: set[str]) -> None:
    registered = {k.device_type: k for k in kernels.get_registered_kernels_for_op(op).kernel}
    assert {"CPU", "GPU"} <= set(registered)
    assert set(registered["GPU"].host_memory_arg) == host_memory
    assert not registered["CPU"].host_memory_arg


@needs_gpu_harness
def test_tvm_cuda_library_refuses_host_tensors(testlib: str) -> None:
    """TVM's add_one for CUDA, built by nvcc for the GPU harness, loads here and
    TVM's own argument checks name the device it expects."""
    add_one = tf_op.Module(GPU_BUILD / "tvm_add_one.so").func("add_one")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)add_one.*device_type.*expected cuda"):
        add_one(tf.constant([1.0, 2.0]))
    np.testing.assert_array_equal(tf_op.Module(testlib).func("add_one")(tf.constant([1.0])).numpy(), [2.0])


@needs_no_cuda_driver
def test_cuda_code_without_a_cuda_driver(modules_dir: Path, testlib: str) -> None:
    """A tvm.compile'd CUDA library needs TVM's CUDA runtime, which needs the CUDA
    driver: the error says which library could not be opened."""
    cudalib = str(modules_dir / "cudafuncs.so")
    with pytest.raises(
        tf.errors.FailedPreconditionError,
        match=r"(?s)cudafuncs\.so.*holds CUDA code.*libtvm_runtime_cuda\.so: libcuda\.so\.1",
    ):
        tf_op.Module(cudalib).func("add_one")(tf.constant([1.0]))
    np.testing.assert_array_equal(tf_op.Module(testlib).func("add_one")(tf.constant([1.0])).numpy(), [2.0])


def test_cpu_libraries_open_no_cuda_library(testlib: str) -> None:
    """TVM's CUDA runtime (and the CUDA runtime it links) is opened only for a
    library that holds CUDA code."""
    script = (
        "import sys, tensorflow as tf, tf_op\n"
        "assert float(tf_op.Module(sys.argv[1]).func('add_one')(tf.constant([1.0]))[0]) == 2.0\n"
        "maps = open('/proc/self/maps').read()\n"
        "print([name for name in ('libtvm_runtime_cuda', 'libcudart') if name in maps])\n"
    )
    run = subprocess.run([sys.executable, "-c", script, testlib], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


@needs_gpu_harness
@needs_no_cuda_driver
def test_gpu_harness_reports_no_gpu() -> None:
    run = subprocess.run(
        [str(GPU_BUILD / "stream_harness"), *(str(GPU_BUILD / f) for f in ("libtvm_ffi.so", "slow_fill.so", "tvm_add_one.so"))],
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 2, run.stderr
    assert "no GPU" in run.stderr


@needs_gpu_harness
@needs_no_cuda_driver
def test_cudaload_reports_no_driver() -> None:
    """cudaload (make test-gpu) goes through dsoop's opening of TVM's CUDA runtime;
    here it gets as far as the missing driver."""
    run = subprocess.run(
        [str(GPU_BUILD / "cudaload"), str(GPU_BUILD / "tvm_add_one_lib.so")],
        env={**os.environ, "TVMDSOOP_LIBRARY_PATH": f"{GPU_BUILD}:{GPU_BUILD / 'tvm'}"},
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 2, run.stderr
    assert "libtvm_runtime_cuda.so: libcuda.so.1" in run.stderr


@needs_gpu_harness
@needs_no_cuda_driver
def test_defop_cuda_library_for_the_harness() -> None:
    """build_defops.py's library (make test-gpu's defop_harness) carries compiled
    GPU code, not CUDA source (which the op could not load), its manifest places
    its ops on the GPU, and here it stops at the missing driver."""
    library = GPU_BUILD / "defop_ops_cuda.so"
    assert b"__global__" not in library.read_bytes()
    ops = tf_op.load_ops(library)
    assert ops.device == "/GPU:0"
    assert ops.names() == ["col_sum", "row_sum", "swish_bias", "vadd"]
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"(?s)defop_ops_cuda\.so.*libcuda\.so\.1"):
        tf_op.Module(library).func("vadd_float32_1d")(tf.constant([1.0]), tf.constant([2.0]))
