"""The TVM worker, seen from the TensorFlow process: where it is, which Python
runs it, and running it.

TVM's compiler never loads in this process (its LLVM clashes with TF's): the
worker is ``compile_model.py`` of the ``tf_op_tvm`` package, installed beside
tf_op, and runs by path in a child process on the TVM Python
(``TVMDSOOP_TVM_PYTHON``, default this Python), which may be another
environment's. This module locates the package without importing it (its
``__init__`` imports TVM).

A worker serves one compile after another (``compile_model.py --serve``) and is
kept after each for the next: importing TVM and its TFLite reader takes about 4
s, which each compile after the first is spared (a small model's whole compile
then takes about 2 s). It goes when it has been idle a minute (``IDLE_SECONDS``), when this
process exits or forks, or when the next compile on its Python runs with other
environment variables or another working folder: each compile sees what a
process started for it would. A tuning compile has a worker of its own, closed
after it (tuning sets TVM's thread variables in its process). The first
compile's worker is started before the model is converted to TFLite
(``_Server.start_ahead``), and imports TVM meanwhile.
"""

from __future__ import annotations

import atexit
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
import threading
import time
from collections.abc import Callable
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

#: The line a serving worker ends each compile's output with, and its exit
#: status after it (compile_model.DONE_PREFIX).
_DONE_PREFIX = "tvmdsoop-done: "

#: How long a worker waits for the next compile before it is closed.
IDLE_SECONDS = 60.0

#: Environment variables that change often and that no compile reads, so a
#: worker is kept across their changes: pytest names each test in one.
_NOT_READ = frozenset({"PYTEST_CURRENT_TEST"})


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


def compile_into(tflite: Callable[[], bytes], target: Target, trials: int, python: str, lib_path: Path,
                 progress: Progress) -> str:
    """Runs the TVM worker on the flatbuffer ``tflite()`` makes, into a temporary
    file beside ``lib_path``, and renames it into place, so a failed or
    interrupted compile leaves nothing under the key; the library's sha256. An
    untuned compile's worker is started first (``_Server.start_ahead``): it
    imports TVM while this process converts the model."""
    if not trials:
        _Server.start_ahead(python)
    tflite_bytes = tflite()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=lib_path.parent) as tmp:
        tflite_path, out_path = Path(tmp, "model.tflite"), Path(tmp, "model.so")
        tflite_path.write_bytes(tflite_bytes)
        # What tuning finds is kept in the cache folder, for the kernels of later compiles.
        tuning = [str(lib_path.parent / "tuning")] if trials else []
        returncode, output = _run(
            python, [str(tflite_path), str(out_path), json.dumps(target), str(trials), *tuning], progress,
            kept=not trials)
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


def _run(python: str, arguments: list[str], progress: Progress, kept: bool) -> tuple[int, str]:
    """One compile (``compile_model.py``'s ``arguments``) by a worker on ``python``:
    a kept one (``kept``) or one of its own. Its progress lines are logged as they
    come (a tuning compile takes minutes: the user sees which stage it is at),
    TVM's own output at DEBUG. Returns the compile's exit status and everything
    it wrote: a worker that ended during it gives the exit status of its process."""
    key = _Server.key(python) if kept else None
    server = _Server.take(python, key) if key is not None else _Server(python, None)
    try:
        returncode, output = server.compile(arguments, progress)
    except BaseException:
        server.kill()  # interrupted in a compile: it is not one to wait for
        raise
    if key is not None and server.alive:
        _Server.put_back(server)
    else:
        server.close()
    return returncode, output


class _Server:
    """A running ``compile_model.py --serve``, and the kept ones, idle, by key.

    Its stdout and stderr are one pipe, read as the compile goes; each compile's
    output ends with its ``_DONE_PREFIX`` line."""

    _lock = threading.Lock()
    _idle: dict[tuple[object, ...], list[_Server]] = {}

    def __init__(self, python: str, key: tuple[object, ...] | None) -> None:
        self.key = key
        self.idle_timer: threading.Timer | None = None  # while kept: closes it when it runs out
        # errors="replace": a byte of TVM's output that is not UTF-8 must not end the compile.
        self.process = subprocess.Popen([python, str(script()), "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace")

    @classmethod
    def start_ahead(cls, python: str) -> None:
        """Starts the kept worker of a compile about to be asked for, unless one
        is idle for this process's state already: it imports TVM and its TFLite
        reader (seconds; ``compile_model.serve``) while this process converts
        the model to TFLite (seconds too), and the compile takes it (``take``).
        Kept as any idle worker is: one that no compile takes goes after
        ``IDLE_SECONDS``."""
        key = cls.key(python)
        if key is None:
            return
        with cls._lock:
            if cls._idle.get(key):
                return
        cls.put_back(cls(python, key))

    @staticmethod
    def key(python: str) -> tuple[object, ...] | None:
        """What a compile's worker must share with it: a process started for the
        compile would have these. None where there is no working folder (it was
        removed): such a compile has a worker of its own."""
        try:
            folder = os.getcwd()
        except OSError:
            return None
        environment = sorted((name, value) for name, value in os.environ.items() if name not in _NOT_READ)
        return (python, str(script()), folder, tuple(environment))

    @classmethod
    def take(cls, python: str, key: tuple[object, ...]) -> _Server:
        """An idle worker for a compile in this process's state, or a new one.
        The idle workers of ``python`` kept for another state go: each holds
        TVM's memory, and the state they were kept for has changed."""
        found, stale = None, []
        with cls._lock:
            for other in [k for k in cls._idle if k[0] == python]:
                for server in cls._idle.pop(other):
                    if server.idle_timer is not None:
                        server.idle_timer.cancel()
                    if found is None and other == key and server.process.poll() is None:
                        found = server
                    else:
                        stale.append(server)
        for server in stale:
            server.close()
        return found if found is not None else cls(python, key)

    @property
    def alive(self) -> bool:
        """Not yet seen to end: reading its output to the end waits for it."""
        return self.process.returncode is None

    @classmethod
    def put_back(cls, server: _Server) -> None:
        """Keeps ``server`` for the next compile, and closes it if none comes
        within ``IDLE_SECONDS``."""
        timer = threading.Timer(IDLE_SECONDS, cls._close_if_idle, (server,))
        timer.daemon = True
        with cls._lock:
            server.idle_timer = timer
            cls._idle.setdefault(server.key, []).append(server)
        timer.start()

    @classmethod
    def _close_if_idle(cls, server: _Server) -> None:
        with cls._lock:
            idle = cls._idle.get(server.key, [])
            if server not in idle:
                return  # taken as the timer ran out
            idle.remove(server)
            if not idle:
                del cls._idle[server.key]
        server.close()

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            servers = [server for idle in cls._idle.values() for server in idle]
            cls._idle.clear()
        for server in servers:
            if server.idle_timer is not None:
                server.idle_timer.cancel()
            server.close()

    @classmethod
    def forget_after_fork(cls) -> None:
        """In a forked child: the parent's workers are the parent's. The child
        closes its copies of their pipes (a worker ends when its parent's end of
        stdin closes) and starts its own."""
        cls._lock = threading.Lock()
        for idle in cls._idle.values():
            for server in idle:
                server._close_pipes()  # stdin's buffer is empty: each request was flushed
        cls._idle = {}

    def compile(self, arguments: list[str], progress: Progress) -> tuple[int, str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(arguments) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: what it wrote before it did is read below
        lines = []
        for line in self.process.stdout:
            if line.startswith(_DONE_PREFIX):
                return int(line[len(_DONE_PREFIX):]), "".join(lines)
            if line == "\n":
                continue  # the worker's own, before its done line (compile_model.serve)
            lines.append(line)
            if line.startswith("tvmdsoop: "):
                progress.stage(line[len("tvmdsoop: "):].rstrip())
            else:
                logger.debug("%s: TVM: %s", progress.name, line.rstrip())
        return self.process.wait(), "".join(lines)

    def close(self) -> None:
        """Lets it end on its own, at the end of its stdin, between compiles."""
        self._close_pipes()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Its stdin first: the end of its requests."""
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # a worker gone before its stdin's buffer was written out


atexit.register(_Server.close_all)
os.register_at_fork(after_in_child=_Server.forget_after_fork)


def tail(text: str) -> str:
    """The last lines of what the worker wrote, for an error message."""
    return "\n".join(text.strip().splitlines()[-_STDERR_TAIL_LINES:])
