"""Shared fixtures: the TVM test library, built once per session.

Under pytest-xdist (make test runs two workers) each worker is a session of its
own; the libraries are still built once per run, by whichever worker asks first
(`built_once`), and the others wait for it and reuse them.

The library is compiled by tests/modules/build_modules.py in a subprocess, so
TVM's compiler (and its LLVM) never shares a process with TensorFlow. That
subprocess runs $TVMDSOOP_TVM_PYTHON, a Python with apache-tvm, when it is set
(tests/tf_matrix.sh sets it: the venv of an older TensorFlow has no TVM), else
the Python running the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shared_build import built_once

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODULES_DIR = Path(__file__).resolve().parent.parent / "modules"

#: The Python that runs the TVM builders (build_modules.py, build_models.py).
TVM_PYTHON = os.environ.get("TVMDSOOP_TVM_PYTHON") or sys.executable

# What the builders make links the runtime of the TVM that made it (a whole
# model's VM lives in libtvm_runtime.so): when that TVM is another Python's, the
# op finds its runtime libraries there, unless TVMDSOOP_LIBRARY_PATH says where.
if TVM_PYTHON != sys.executable and not os.environ.get("TVMDSOOP_LIBRARY_PATH"):
    os.environ["TVMDSOOP_LIBRARY_PATH"] = subprocess.run(
        [TVM_PYTHON, str(MODULES_DIR.parent.parent / "python" / "tf_op" / "tvm_paths.py")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def _build_modules(out: Path) -> None:
    subprocess.run([TVM_PYTHON, str(MODULES_DIR / "build_modules.py"), str(out)], check=True)


@pytest.fixture(scope="session")
def modules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the test libraries, built once per run."""
    return built_once(tmp_path_factory, "tvm_modules", _build_modules)


@pytest.fixture(scope="session")
def testlib(modules_dir: Path) -> str:
    """testfuncs.so (apache-tvm): add_one, vector_add, sum9, inc_<dtype>, ..."""
    return str(modules_dir / "testfuncs.so")


@pytest.fixture(scope="session")
def ffilib(modules_dir: Path) -> str:
    """ffifuncs.so (tvm-ffi C++): conj_complex64/128, pointer_probe, raise_*."""
    return str(modules_dir / "ffifuncs.so")


#: What tests/modules/build_models.py must write for the whole-model tests; it
#: skips a model it cannot build, so the fixture checks that each is there.
MODEL_FILES = (
    "cnn.keras", "cnn_b1.so", "cnn_b4.so", "mlp.so", "mlp_params.npz",
    "two_outputs.so", "onnx_model.so", "onnx_model.onnx",
)


def _build_models(out: Path) -> None:
    subprocess.run([sys.executable, str(MODULES_DIR / "keras_cnn.py"), str(out), "--batch", "1", "4"], check=True)
    subprocess.run([TVM_PYTHON, str(MODULES_DIR / "build_models.py"), str(out)], check=True)
    missing = [name for name in MODEL_FILES if not (out / name).is_file()]
    assert not missing, f"build_models.py did not write {missing}"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole-model libraries (Relax VM executables), built once per run.

    keras_cnn.py (TensorFlow) writes the Keras CNN and its TFLite forms, then
    build_models.py (TVM) compiles them and the other models: two subprocesses,
    so TVM's compiler never shares a process with TensorFlow. keras_cnn.py runs
    on the TensorFlow under test (the tests load its cnn.keras with that Keras),
    build_models.py on TVM_PYTHON."""
    return built_once(tmp_path_factory, "tvm_models", _build_models)
