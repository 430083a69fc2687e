"""Installing as a user does (docs/install.md): the sdist carries the sources, a
wheel built from it with pip's default isolated build is compiled against this
environment's TensorFlow, and the installed package runs outside the repository
with nothing from its build/ folder. Also: the build's clear errors, and the
refusal of an op library built for another TensorFlow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tensorflow as tf

import tf_op
from helpers import run_python

REPO = Path(__file__).resolve().parents[2]
#: What a user's process has of ours: none of the variables make or the build set.
OUR_VARIABLES = ("TVMDSOOP_LIBRARY", "TVMDSOOP_LIBRARY_PATH", "TVMDSOOP_PROBE", "PYTHONPATH")


def _user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OUR_VARIABLES}
    return {**env, **extra}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run(
        [sys.executable, "-c", f"from scikit_build_core.build import build_sdist; build_sdist({str(out)!r})"],
        cwd=REPO, check=True, capture_output=True,
    )
    (tarball,) = out.glob("tvmdsoop-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def wheel(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built as `pip install` builds it: isolated, from the sdist."""
    out = tmp_path_factory.mktemp("wheel")
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(sdist)],
        capture_output=True, text=True, env=_user_env(),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a folder of its own (its dependency, apache-tvm-ffi,
    is this environment's)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
        check=True,
    )
    return target


def test_sdist_carries_the_sources_the_build_needs(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    needed = {
        "pyproject.toml", "CMakeLists.txt", "LICENSE", "go.mod", "go.sum",
        "cmd/tvm_dso_op/main.go", "cmd/probe/probe.c", "cmd/eager_entry/eager_entry.c", "dsoop/dsoop.c", "dsoop/vm.c",
        "kernels/ops.cc", "kernels/tvm_dso_op_kernel.cc", "kernels/call.h", "dlpack/dlpack.h",
        "python/tf_op/__init__.py", "python/tf_op/compiler/__init__.py", "python/tf_op_tvm/compile_model.py",
        "third_party/tvm-ffi/include/tvm/ffi/c_api.h", "third_party/tvm-ffi/LICENSE",
    }
    assert needed <= names, needed - names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "build/"))]


def _runpath(library: bytes, tmp_path: Path) -> str:
    (tmp_path / "lib.so").write_bytes(library)
    dynamic = subprocess.run(["readelf", "-d", str(tmp_path / "lib.so")], capture_output=True, text=True, check=True)
    (line,) = [line for line in dynamic.stdout.splitlines() if "(RUNPATH)" in line or "(RPATH)" in line]
    return line.split("[", 1)[1].rstrip("]")


def test_wheel_is_tagged_for_the_platform_and_built_for_this_tensorflow(wheel: Path, tmp_path: Path) -> None:
    assert wheel.name.endswith("-cp310-abi3-linux_x86_64.whl"), wheel.name
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        assert {"tf_op/libtvm_dso_op.so", "tf_op/tvmdsoop-probe", "tf_op/tvmdsoop_build.json",
                "tf_op/_eager_entry.abi3.so"} <= names
        info = json.loads(whl.read("tf_op/tvmdsoop_build.json"))
        library = whl.read("tf_op/libtvm_dso_op.so")
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert info["tensorflow"] == tf.__version__
    # No library path of the machine that built it: TF is found beside the package.
    assert _runpath(library, tmp_path) == "$ORIGIN/../tensorflow"
    # TensorFlow is checked, not declared; TVM's runtime is an extra.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(line.startswith("Requires-Dist: apache-tvm-ffi") for line in requires), requires
    assert not any("tensorflow" in line for line in requires), requires
    assert any("apache-tvm" in line and 'extra == "tvm"' in line for line in requires), requires


def test_installed_package_runs_outside_the_repository(installed: Path, testlib: str, ffilib: str,
                                                       tmp_path: Path) -> None:
    """The op in a graph, and an eager call through the installed eager entry."""
    script = (
        "import json, sys, tensorflow as tf, tf_op\n"
        "add_one = tf_op.Module(sys.argv[1]).func('add_one')\n"
        "identity = tf_op.Module(sys.argv[2]).func('identity', returns=True)\n"
        "echoed = identity(tf.constant([4.0, 5.0])).numpy().tolist()\n"
        "print(json.dumps({'file': tf_op.__file__, 'library': str(tf_op.library_path()),\n"
        "                  'version': tf_op.__version__, 'echoed': echoed,\n"
        "                  'entry': type(identity._eager.call).__module__,\n"
        "                  'values': add_one(tf.constant([1.0, 2.5])).numpy().tolist()}))\n"
    )
    run = run_python(script, testlib, ffilib, env=_user_env(PYTHONPATH=str(installed)), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["file"] == str(installed / "tf_op" / "__init__.py")
    assert out["library"] == str(installed / "tf_op" / "libtvm_dso_op.so")
    assert out["version"] == tf_op.__version__
    assert out["values"] == [2.0, 3.5]
    assert (out["entry"], out["echoed"]) == ("tf_op._eager_entry", [4.0, 5.0])


def test_library_built_for_another_tensorflow_is_refused_before_loading(installed: Path, tmp_path: Path) -> None:
    package = tmp_path / "tf_op"
    shutil.copytree(installed / "tf_op", package)
    info_path = package / "tvmdsoop_build.json"
    info_path.write_text(json.dumps({**json.loads(info_path.read_text()), "tensorflow": "2.99.0"}))
    script = (
        "import tensorflow as tf\n"
        "try:\n"
        "    import tf_op\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
        "print('loaded' if any('libtvm_dso_op' in line for line in open('/proc/self/maps')) else 'not loaded')\n"
    )
    run = run_python(script, env=_user_env(PYTHONPATH=str(tmp_path)), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    first, last = run.stdout.strip().splitlines()[-2:]
    assert first.startswith("BuildMismatchError")
    assert "built for TensorFlow 2.99.0" in first and f"TensorFlow {tf.__version__} is running" in first
    assert "pip install --force-reinstall" in first
    assert last == "not loaded"


def _configure(tmp_path: Path, python: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cmake", "-S", str(REPO), "-B", str(tmp_path / "build"), f"-DPython3_EXECUTABLE={python}"],
        capture_output=True, text=True, env={**os.environ, "PATH": path},
    )


def test_build_without_go_names_the_version_it_needs(tmp_path: Path) -> None:
    go = shutil.which("go")
    assert go is not None, "make test runs with Go"
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != str(Path(go).parent))
    run = _configure(tmp_path, sys.executable, path)
    assert run.returncode != 0
    required = next(line.split()[1] for line in (REPO / "go.mod").read_text().splitlines() if line.startswith("go "))
    assert f"needs Go {required} or newer" in run.stderr, run.stderr


def test_build_without_tensorflow_says_what_to_install(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    run = _configure(tmp_path, str(tmp_path / "venv" / "bin" / "python"), os.environ["PATH"])
    assert run.returncode != 0
    assert "`import tensorflow` failed there" in run.stderr, run.stderr
    assert "tensorflow-cpu" in run.stderr


def test_vendored_tvm_ffi_headers_are_the_pinned_wheels() -> None:
    """One set of TVM-FFI headers: the copies the build uses are the installed
    apache-tvm-ffi's, so raising its pin without copying them fails here."""
    import tvm_ffi.libinfo

    wheel_include = Path(tvm_ffi.libinfo.find_include_path())
    for header in ("tvm/ffi/c_api.h", "tvm/ffi/extra/c_env_api.h"):
        vendored = REPO / "third_party" / "tvm-ffi" / "include" / header
        assert vendored.read_bytes() == (wheel_include / header).read_bytes(), header
