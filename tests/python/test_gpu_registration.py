"""The GPU kernels, checked on a CPU-only machine: they are built and registered
in TensorFlow's kernel registry with the right host-memory inputs. (Running them
needs a GPU build of TensorFlow; see docs/gpu.md.)"""

from __future__ import annotations

import pytest
from tensorflow.python.framework import kernels

import tf_op  # noqa: F401 - loads the op library


@pytest.mark.parametrize(
    ("op", "host_memory"),
    [("TVMDSOOp", {"output_dims", "library"}), ("TvmDsoOp", {"dynamic_output_shape"})],
)
def test_gpu_kernel_is_registered(op: str, host_memory: set[str]) -> None:
    registered = {k.device_type: k for k in kernels.get_registered_kernels_for_op(op).kernel}
    assert {"CPU", "GPU"} <= set(registered)
    assert set(registered["GPU"].host_memory_arg) == host_memory
    assert not registered["CPU"].host_memory_arg
