"""A portable library's higher levels, each built by a process of its own
(``LevelProcess``) while the compile builds the baseline
(``compile_model.export_levels``): how many at once, the processes' fork
server, and their lifetime, which ends with the compile's however it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

#: How many processes a portable compile builds its levels in at once (its
#: own included); 1: one after another, in its own. Each holds the model
#: (ResNet50's compile peaks at 2.8 GB with three, 1.2 GB with one).
LEVEL_PROCESSES_ENV = "TVMDSOOP_COMPILE_PROCESSES"


def level_processes(levels: int) -> int:
    """How many processes may build a portable library's ``levels`` levels at
    once: ``LEVEL_PROCESSES_ENV``, else one a level where this process may run
    on two CPUs or more (on 2 CPUs three processes beat two: ResNet50 15 and 18
    s against 16 and 23, alternating; the processes wait on their exports'
    writes too), else one."""
    value = os.environ.get(LEVEL_PROCESSES_ENV, "")
    if not value:
        return levels if len(os.sched_getaffinity(0)) >= 2 else 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{LEVEL_PROCESSES_ENV}={value!r}: expected a whole number of processes, 1 or more")
    return int(value)


class LevelProcessError(Exception):
    """A level of a portable library failed in the process that built it."""


def start_level_server(preload: Sequence[str]) -> Any:
    """Starts multiprocessing's fork server, from which each ``LevelProcess``
    comes, if it is not running, and returns its context. The server imports
    the modules ``preload`` names before it starts the first process (about a
    second, once a worker). It is started in this file's folder: Python runs it
    with ``-c``, which puts its working folder first on its path, and a
    ``tvm.py`` or ``tflite.py`` in the user's must not be what it imports. Each
    process then runs in this one's folder and path."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(list(preload))
    here = os.getcwd()
    os.chdir(Path(__file__).resolve().parent)
    try:
        forkserver.ensure_running()
    finally:
        os.chdir(here)
    return multiprocessing.get_context("forkserver")


class LevelProcess:
    """One level of a portable library built by a process of its own: started
    on entry, stopped on exit if it has not ended (the compile failed or was
    interrupted: what it builds is not needed). Its processes come from
    multiprocessing's fork server, a process of this one's that has imported
    TVM and forks nothing else, so each starts at once and with TVM's state
    clean (a fork of this process would copy the state of TVM's thread pool
    without its threads). Each runs in this process's environment of the
    moment (``ensure_linker``'s $CXX), and ends when this process does, however
    it ends (``_end_with``): killing a compile leaves nothing building."""

    def __init__(self, context: Any, build: Callable[[dict[str, object], Path], dict[str, float]],
                 level: dict[str, object], name: str, out_path: Path, work_dir: str) -> None:
        self.name = name
        self._done = False
        self._results, sender = context.Pipe(duplex=False)
        watch, self._alive = context.Pipe(duplex=False)  # this process's end: closed when it ends
        self._process = context.Process(target=_level_process_main, name=f"tvmdsoop level {self.name}",
                                        args=(sender, watch, build, level, out_path, dict(os.environ),
                                              work_dir))
        try:
            self._process.start()
        finally:
            # The process's copies are the only ones: the end of the results is its end.
            sender.close()
            watch.close()

    def __enter__(self) -> LevelProcess:
        return self

    def __exit__(self, *_: object) -> None:
        if self._done:
            self._process.join(timeout=10)  # it sent its result: it is ending
        # Its end of the watch pipe ends it, however its process is seen from
        # here (with the fork server gone, multiprocessing takes it for ended);
        # the kill takes what it runs with it (the linker, in an export).
        self._alive.close()
        if not self._done or self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        self._process.join()
        self._results.close()

    def result(self) -> dict[str, float]:
        """Waits for the level: its figures, or a ``LevelProcessError`` that says
        why it failed, or how its process ended without a result."""
        wait([self._results, self._process.sentinel])
        try:
            if not self._results.poll():
                raise EOFError  # it ended, and sent nothing
            outcome, value = self._results.recv()
        except EOFError:
            self._process.join()
            raise LevelProcessError(f"building for {self.name}: its process ended with exit code "
                                    f"{self._process.exitcode} before it was done") from None
        self._done = True
        if outcome != "done":
            raise LevelProcessError(f"building for {self.name}: {value}")
        return dict(value)


def _level_process_main(results: Any, watch: Any, build: Callable[[dict[str, object], Path], dict[str, float]],
                        level: dict[str, object], out_path: Path, environment: dict[str, str],
                        work_dir: str) -> None:
    """A ``LevelProcess``: ``build(level, out_path)``, its figures or its error
    sent back. In a process group of its own, which the compile kills whole;
    with its temporary files in the compile's ``work_dir`` (TVM's export makes
    its own folder in $TMPDIR, which a killed process would leave)."""
    os.setpgid(0, 0)
    _end_with(watch)
    os.environ.clear()
    os.environ.update(environment)
    os.environ["TMPDIR"] = tempfile.tempdir = work_dir
    try:
        outcome: tuple[str, Any] = ("done", build(level, out_path))
    except Exception as err:  # noqa: BLE001  (each failure goes back to the compile the same way)
        traceback.print_exc()
        outcome = ("failed", f"{type(err).__name__}: {err}")
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # what C code wrote, before the compile's done line
    results.send(outcome)


def _end_with(watch: Any) -> None:
    """Ends this process when the compile's end of ``watch`` closes: when the
    compile ends, killed or not. Not with the process that forked it (Linux's
    parent-death signal): that is multiprocessing's fork server, which waits
    for the processes it started before it ends."""

    def wait_for_the_end() -> None:
        with contextlib.suppress(EOFError, OSError):
            watch.recv_bytes()  # nothing is sent: it returns at the end
        os._exit(70)

    threading.Thread(target=wait_for_the_end, name="tvmdsoop compile watch", daemon=True).start()
