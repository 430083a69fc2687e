"""The TVM worker, seen from the TensorFlow process: where it is, which Python
runs it, and running it.

TVM's compiler never loads in this process (its LLVM clashes with TF's): the
worker is ``compile_model.py`` of the ``tf_op_tvm`` package, installed beside
tf_op, and runs by path in a child process on the TVM Python
(``TVMDSOOP_TVM_PYTHON``, default this Python), which may be another
environment's. This module locates the package without importing it (its
``__init__`` imports TVM).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tf_op.compiler.errors import CompileError
from tf_op.module import file_sha256

if TYPE_CHECKING:  # targets runs the worker (--host-target): imported for the type only
    from tf_op.compiler.progress import Progress
    from tf_op.compiler.targets import Target

logger = logging.getLogger(__package__)

#: The package holding the worker, and the worker's file in it.
_PACKAGE = "tf_op_tvm"
_SCRIPT = "compile_model.py"

#: Starts the worker's line that says which op failed (compile_model.ERROR_PREFIX):
#: the first line of the CompileError.
_ERROR_PREFIX = "tvmdsoop-error: "

#: How many lines of the worker's stderr a CompileError shows.
_STDERR_TAIL_LINES = 40


def package_dir() -> Path:
    """The folder of the ``tf_op_tvm`` package this Python would import. Found by
    ``find_spec``, which for a top-level package searches the path and runs none
    of its code."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CompileError(f"tf_op.compile: no {_PACKAGE} package on this Python's path: it holds the TVM "
                           "worker and installs with tf_op (pip install tvmdsoop)")
    return Path(list(spec.submodule_search_locations)[0])


def script() -> Path:
    """The worker, run by path: ``compile_model.py --version``, ``--host-target``,
    or ``MODEL.tflite OUT.so TARGET_JSON [TUNING_TRIALS]``."""
    return package_dir() / _SCRIPT


@functools.lru_cache(maxsize=None)
def digest() -> str:
    """The SHA-256 of the worker's source: every ``.py`` file of the ``tf_op_tvm``
    package (the worker and the modules it runs, whichever they are), so that a
    library another worker compiled, with other schedule steps or math, is
    another cache entry."""
    package = package_dir()
    sha = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        sha.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def tvm_python() -> str:
    return os.environ.get("TVMDSOOP_TVM_PYTHON") or sys.executable


@functools.lru_cache(maxsize=None)
def tvm_version(python: str) -> str:
    """The TVM version of ``python``, without importing TVM into this process."""
    if python == sys.executable:
        try:
            return importlib.metadata.version("apache-tvm")
        except importlib.metadata.PackageNotFoundError as err:
            raise CompileError(f"tf_op.compile: {python} has no apache-tvm: install tvmdsoop's [compile] extra "
                               "(pip install 'tvmdsoop[compile]'), or set TVMDSOOP_TVM_PYTHON to a Python "
                               "that has it") from err
    result = subprocess.run([python, str(script()), "--version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"tf_op.compile: {python} (TVMDSOOP_TVM_PYTHON) has no apache-tvm: install tvmdsoop's "
                           f"[compile] extra there (pip install 'tvmdsoop[compile]'):\n{tail(result.stderr)}")
    return result.stdout.strip()


def compile_into(tflite_bytes: bytes, target: Target, trials: int, python: str, lib_path: Path,
                 progress: Progress) -> str:
    """Runs the TVM worker into a temporary file beside ``lib_path`` and renames it
    into place, so a failed or interrupted compile leaves nothing under the key;
    the library's sha256."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=lib_path.parent) as tmp:
        tflite_path, out_path = Path(tmp, "model.tflite"), Path(tmp, "model.so")
        tflite_path.write_bytes(tflite_bytes)
        # What tuning finds is kept in the cache folder, for the kernels of later compiles.
        tuning = [str(lib_path.parent / "tuning")] if trials else []
        returncode, output = _run(
            [python, str(script()), str(tflite_path), str(out_path), json.dumps(target), str(trials), *tuning],
            progress)
        if returncode != 0 or not out_path.is_file():
            missing = missing_module(output)
            if missing is not None:
                module, extra = missing
                raise CompileError(f"tf_op.compile({progress.name}): {python} lacks the Python module {module!r}, "
                                   f"which TVM's compile needs: install tvmdsoop's [{extra}] extra there "
                                   f"(pip install 'tvmdsoop[{extra}]'), or set TVMDSOOP_TVM_PYTHON to a Python "
                                   f"that has it\n{tail(output)}")
            said = [line[len(_ERROR_PREFIX):].strip() for line in output.splitlines()
                    if line.startswith(_ERROR_PREFIX)]
            first = f"{said[-1]}; TVM's output follows" if said else "TVM could not compile the model"
            raise CompileError(f"tf_op.compile({progress.name}): {first} (target {target!r}, exit {returncode}):"
                               f"\n{tail(output)}")
        digest = file_sha256(out_path)
        os.replace(out_path, lib_path)
    figures = output.strip().splitlines()[-1] if output.strip() else ""
    seconds = time.perf_counter() - start
    logger.info("TVM compiled %s in %.2f s (%s): %s", progress.name, seconds, figures, lib_path)
    progress.stage(f"TVM compiled it in {seconds:.2f} s")
    return digest


#: The extra of tvmdsoop that brings each module the worker imports.
_EXTRA_OF_MODULE = {"tvm": "compile", "tflite": "compile", "psutil": "tune", "cloudpickle": "tune",
                    "xgboost": "tune"}


def missing_module(output: str) -> tuple[str, str] | None:
    """The module the worker failed to import, and the extra that brings it;
    None for another failure."""
    for match in re.finditer(r"No module named '([\w.]+)'", output):
        top = match.group(1).split(".")[0]
        if top in _EXTRA_OF_MODULE:
            return match.group(1), _EXTRA_OF_MODULE[top]
    return None


def _run(command: list[str], progress: Progress) -> tuple[int, str]:
    """Runs the TVM worker, logging its progress lines as they come (a tuning
    compile takes minutes: the user sees which stage it is at) and TVM's own
    output at DEBUG; its exit status and everything it wrote."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as worker:
        assert worker.stdout is not None
        for line in worker.stdout:
            lines.append(line)
            if line.startswith("tvmdsoop: "):
                progress.stage(line[len("tvmdsoop: "):].rstrip())
            else:
                logger.debug("%s: TVM: %s", progress.name, line.rstrip())
    return worker.returncode, "".join(lines)


def tail(text: str) -> str:
    """The last lines of what the worker wrote, for an error message."""
    return "\n".join(text.strip().splitlines()[-_STDERR_TAIL_LINES:])
