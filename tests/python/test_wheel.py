"""The binary wheel's parts that need no TensorFlow matrix: which op library the
package picks, the audit of what a library links (packaging/build_wheel.py) and
the metadata. `make test-wheel` builds the whole wheel and installs it per
TensorFlow in a clean venv (packaging/check_wheel.sh)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import tensorflow as tf

from tf_op import _library

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build_wheel() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_wheel", REPO / "packaging" / "build_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wheel_libraries(tmp_path: Path) -> Path:
    """A wheel's folder of op libraries for TF 2.18 and 2.21 (copies of the
    op library this test runs with)."""
    for version in ("2.21", "2.18"):
        folder = tmp_path / "_ops" / f"tf{version}"
        folder.mkdir(parents=True)
        shutil.copy(_library.library_path(), folder / _library.LIBRARY_NAME)
    return tmp_path / "_ops"


@pytest.mark.parametrize("running", ["2.18.1", "2.21.0", "2.21.0rc1"])
def test_wheel_loads_the_library_of_the_running_tensorflow(wheel_libraries: Path, running: str) -> None:
    minor = ".".join(running.split(".")[:2])
    assert _library.wheel_library(wheel_libraries, running) == wheel_libraries / f"tf{minor}" / "libtvm_dso_op.so"


@pytest.mark.parametrize("running", ["2.20.0", "2.17.1", "3.0.0"])
def test_wheel_names_its_versions_for_another_tensorflow(wheel_libraries: Path, running: str) -> None:
    with pytest.raises(_library.UnsupportedTensorFlowError,
                       match=rf"holds the op library for TensorFlow 2\.18, 2\.21 .*TensorFlow {running} is running"):
        _library.wheel_library(wheel_libraries, running)


def test_wheel_without_libraries_says_so(tmp_path: Path) -> None:
    (tmp_path / "_ops").mkdir()
    with pytest.raises(_library.UnsupportedTensorFlowError, match="holds no op library"):
        _library.wheel_library(tmp_path / "_ops", tf.__version__)


@pytest.mark.parametrize("name", ["tvmdsoop-probe", "_eager_entry.abi3.so"])
def test_audit_passes_what_every_system_has(build_wheel: ModuleType, name: str) -> None:
    build_wheel.audit(_library.library_path().parent / name)  # libc only


def test_audit_refuses_a_folder_of_the_build_machine(build_wheel: ModuleType) -> None:
    """The development build finds TensorFlow by the .venv's absolute path."""
    with pytest.raises(build_wheel.AuditError, match=r"its rpath names /\S+/tensorflow, a folder of the build"):
        build_wheel.audit(_library.library_path())


def test_audit_refuses_a_library_users_may_lack(build_wheel: ModuleType) -> None:
    """TF's own Python extension links its C++ API library: not in every process."""
    pywrap = Path(tf.__file__).parent / "python" / "_pywrap_tensorflow_internal.so"
    with pytest.raises(build_wheel.AuditError, match=r"links libtensorflow_cc\.so\.2, which is not part of every"):
        build_wheel.audit(pywrap)


def test_audit_refuses_symbol_versions_newer_than_the_tag(build_wheel: ModuleType) -> None:
    old_glibc = {**build_wheel.MAX_SYMBOL_VERSIONS, "GLIBC": (2, 17)}
    with pytest.raises(build_wheel.AuditError, match=r"needs GLIBC_2\.\d+, newer than .* promises \(GLIBC_2\.17\)"):
        build_wheel.audit(_library.library_path().parent / "tvmdsoop-probe", old_glibc)


def test_extras_compose(build_wheel: ModuleType) -> None:
    """Each extra that brings apache-tvm pins the same apache-tvm-ffi, so adding
    one after another reinstalls nothing; the metadata says so."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    ffi_pins = {extra: [r for r in reqs if r.startswith("apache-tvm-ffi")] for extra, reqs in extras.items()
                if any(r.startswith("apache-tvm>") for r in reqs)}
    assert set(ffi_pins) == {"tvm", "compile", "tune"}
    assert {tuple(p) for p in ffi_pins.values()} == {("apache-tvm-ffi==0.1.14.post0",)}
    assert all(any(r.startswith("tflite") for r in extras[e]) for e in ("compile", "tune"))
    metadata = build_wheel._metadata(project, "0.0.0")
    assert 'Requires-Dist: tflite>=2.18.0,<2.19; extra == "compile"' in metadata
    assert "Provides-Extra: tune" in metadata
