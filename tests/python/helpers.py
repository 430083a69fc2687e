"""What several test files share that is not a fixture."""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

#: The dtypes the test library has an ``inc_<dtype>`` for: tests/modules/dtypes.py,
#: which the TVM side reads too (run, not imported: tests/modules is not a package).
TVM_DTYPES: list[str] = runpy.run_path(str(Path(__file__).resolve().parents[1] / "modules" / "dtypes.py"))["TVM_DTYPES"]


def ffi_only_library_path() -> str:
    """The folder of the libtvm_ffi.so the op loads (from TVMDSOOP_LIBRARY_PATH, or
    the installed packages' as tf_op finds them), alone: TVM-FFI without TVM's
    runtime. Found without importing tvm_ffi, whose own copy of the library may
    not be the op's (the TensorFlow matrix's venvs have one each)."""
    from tf_op.tvm_paths import tvm_library_path

    for folder in (os.environ.get("TVMDSOOP_LIBRARY_PATH") or tvm_library_path()).split(os.pathsep):
        if (Path(folder) / "libtvm_ffi.so").is_file():
            return folder
    raise AssertionError("no folder holding libtvm_ffi.so on the op's search path")


def buffer_address(t: tf.Tensor) -> int:
    """The address of an eager tensor's buffer (``numpy()`` might copy): read from
    the DLTensor that TF's own DLPack export shares the buffer through."""
    capsule = tf.experimental.dlpack.to_dlpack(t)
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = get_pointer(capsule, b"dltensor")
    return ctypes.c_void_p.from_address(managed).value  # DLTensor.data comes first


def run_python(
    script: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Runs script in a fresh interpreter, as a server would load a model."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ, **(env or {})},
    )


def host_cpu_flags() -> set[str]:
    """The first "flags" line of /proc/cpuinfo; empty where there is none."""
    cpuinfo = Path("/proc/cpuinfo")
    line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "") \
        if cpuinfo.is_file() else ""
    return set(line.partition(":")[2].split())


#: Run before every script of run_tvm_script: what the scripts share (a
#: script's traceback counts its lines from this prelude's first).
_TVM_SCRIPT_PRELUDE = """
def allocates_workspace(func, name, target):
    \"\"\"Whether PrimFunc func, compiled for target as name, calls
    TVMBackendAllocWorkspace: a buffer that TVM did not put on the stack (1 KiB
    and more), allocated and freed with calls each time its loop comes round.\"\"\"
    import tvm
    code = tvm.compile(func.with_attr("global_symbol", name), target=target).mod.inspect_source("ll")
    return "TVMBackendAllocWorkspace" in code
"""


def run_tvm_script(script: str, *args: str, timeout: int = 600, **environment: str) -> Any:
    """What ``script`` (Python source) prints as JSON on its last line, run
    with ``args`` on the TVM Python (the compile worker's), on two of TVM's
    threads, with ``environment`` added; a script that fails fails the test
    with its stderr. The script may call ``allocates_workspace`` (above)."""
    from conftest import TVM_PYTHON

    result = subprocess.run([TVM_PYTHON, "-c", _TVM_SCRIPT_PRELUDE + script, *args], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "TVM_NUM_THREADS": "2", **environment})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def run_in_threads(worker: Callable[[int], None], count: int) -> None:
    """Runs worker(0..count-1) in as many threads at once and re-raises the
    first exception any of them raised: a failure in a thread fails the test."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as e:  # noqa: BLE001 - reported by the calling thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def legacy_graph(
    lib: str, func_name: str, shape_input: np.ndarray, static_shape: list[int] | None,
    inputs: Sequence[tuple[str, tf.DType]] = (("x", tf.float32),), output_dtype: tf.DType = tf.float32,
) -> tf.compat.v1.GraphDef:
    """A GraphDef as tvm.contrib.tf_op wrote it: a placeholder per input, a Const
    for the dynamic shape, and a TvmDsoOp node named "tvm"."""
    graph_def = tf.compat.v1.GraphDef()
    for name, dtype in inputs:
        x = graph_def.node.add(name=name, op="Placeholder")
        x.attr["dtype"].type = dtype.as_datatype_enum
    shape = graph_def.node.add(name="shape", op="Const")
    shape.attr["dtype"].type = tf.int64.as_datatype_enum
    shape.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(shape_input, dtype=tf.int64))
    node = graph_def.node.add(name="tvm", op="TvmDsoOp")
    node.input.extend([name for name, _ in inputs] + ["shape"])
    node.attr["ListT"].list.type.extend(dtype.as_datatype_enum for _, dtype in inputs)
    node.attr["lib_path"].s = lib.encode()
    node.attr["func_name"].s = func_name.encode()
    node.attr["output_dtype"].type = output_dtype.as_datatype_enum
    node.attr["has_static_output_shape"].b = static_shape is not None
    node.attr["static_output_shape"].list.i.extend(static_shape or [])
    return graph_def


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie no one reaps counts)."""
    try:
        return (Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> bool:
    """Whether ``condition()`` holds within ``seconds``, asked every 50 ms."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
