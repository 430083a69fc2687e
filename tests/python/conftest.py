"""Shared fixtures: the TVM test library, built once per session.

The library is compiled by tests/modules/build_modules.py in a subprocess, so
TVM's compiler (and its LLVM) never shares a process with TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODULES_DIR = Path(__file__).resolve().parent.parent / "modules"


@pytest.fixture(scope="session")
def modules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the test libraries, built once per session."""
    out = tmp_path_factory.mktemp("tvm_modules")
    subprocess.run([sys.executable, str(MODULES_DIR / "build_modules.py"), str(out)], check=True)
    return out


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


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole-model libraries (Relax VM executables), built once per session.

    keras_cnn.py (TensorFlow) writes the Keras CNN and its TFLite forms, then
    build_models.py (TVM) compiles them and the other models: two subprocesses,
    so TVM's compiler never shares a process with TensorFlow."""
    out = tmp_path_factory.mktemp("tvm_models")
    subprocess.run([sys.executable, str(MODULES_DIR / "keras_cnn.py"), str(out), "--batch", "1", "4"], check=True)
    subprocess.run([sys.executable, str(MODULES_DIR / "build_models.py"), str(out)], check=True)
    missing = [name for name in MODEL_FILES if not (out / name).is_file()]
    assert not missing, f"build_models.py did not write {missing}"
    return out
