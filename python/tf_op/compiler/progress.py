"""What a compile is doing, said to the user while it runs.

Each stage of a compile (trace, convert, import, schedule, compile, load, the
tuning trials) is a line logged at INFO on ``tf_op.compiler``, as ever. A
compile still running after ``TVMDSOOP_PROGRESS_AFTER_S`` seconds (default 3)
also prints them on stderr, the earlier ones first, each with the time since the
compile began: a quick compile says nothing, a slow one is never silent. A stage
that lasts says so every ``HEARTBEAT_S`` seconds; tuning's trials move a tqdm
bar on a terminal where tqdm is installed (the ``tune`` extra brings it).
``TVMDSOOP_PROGRESS=0`` keeps the lines in the log only, ``=1`` prints every
compile's.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from typing import Any, TextIO

logger = logging.getLogger(__package__)

#: The compile time after which stage lines are printed too.
DEFAULT_AFTER_S = 3.0
#: The longest a printing compile stays silent: a stage still running says so.
HEARTBEAT_S = 30.0
#: The worker's line for tuning's progress (compile_model.py's search()).
_TRIALS = re.compile(r"^tuning: (\d+) of (\d+) trials built")


class Progress:
    """The stage lines of one compile (``name``): logged, and printed on
    ``stream`` (stderr) once the compile has run longer than ``after_s``."""

    def __init__(self, name: str, after_s: float | None = None, stream: TextIO | None = None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        setting = os.environ.get("TVMDSOOP_PROGRESS", "")
        if after_s is None:
            after_s = {"0": float("inf"), "1": 0.0}.get(setting, _env_seconds("TVMDSOOP_PROGRESS_AFTER_S"))
        self.name = name
        self._stream = stream
        self._start = self._said = time.perf_counter()
        self._lock = threading.Lock()
        self._held: list[str] = []  # the lines said before the compile was slow enough to show them
        self._last = "started"
        self._showing = after_s <= 0
        self._bar: Any = None  # tqdm's bar of tuning trials, while one moves
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        if after_s < float("inf"):
            self._watcher = threading.Thread(target=self._watch, args=(after_s, heartbeat_s), daemon=True,
                                             name=f"tf_op.compile({name}) progress")
            self._watcher.start()

    def stage(self, message: str) -> None:
        """One stage's line: ``message`` (say what was done and in how long)."""
        logger.info("%s: %s", self.name, message)
        with self._lock:
            self._last = message
            trials = _TRIALS.match(message)
            if self._showing and trials and self._move_bar(int(trials[1]), int(trials[2])):
                return
            line = self._line(message)
            if self._showing:
                self._print(line)
            else:
                self._held.append(line)

    def close(self) -> None:
        """The compile ended: nothing more is printed for it."""
        self._done.set()
        with self._lock:
            self._close_bar()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _watch(self, after_s: float, heartbeat_s: float) -> None:
        if self._done.wait(after_s):
            return
        with self._lock:
            self._showing = True
            for line in self._held:
                self._print(line)
            self._held.clear()
        while not self._done.wait(min(heartbeat_s, 1.0)):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()  # its clock moves while a round of trials runs
                    continue
                if time.perf_counter() - self._said >= heartbeat_s:
                    self._print(self._line(f"still at it (the last stage: {self._last})"))

    def _line(self, message: str) -> str:
        return f"tf_op.compile({self.name}) {time.perf_counter() - self._start:6.1f} s: {message}"

    def _print(self, line: str) -> None:
        self._close_bar()
        print(line, file=self._stream or sys.stderr, flush=True)
        self._said = time.perf_counter()

    def _move_bar(self, built: int, trials: int) -> bool:
        """Moves the bar of trials (made at the first count); False where there
        is no bar to show: tqdm missing, or a stream that is not a terminal."""
        stream = self._stream or sys.stderr
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                return False
            if not (hasattr(stream, "isatty") and stream.isatty()):
                return False
            self._bar = tqdm(total=trials, desc=f"tf_op.compile({self.name}) tuning", unit="trial", file=stream)
        self._bar.update(built - self._bar.n)
        self._said = time.perf_counter()
        return True

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _env_seconds(name: str) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else DEFAULT_AFTER_S
    except ValueError:
        logger.warning("%s=%r is not a number of seconds: using %s", name, value, DEFAULT_AFTER_S)
        return DEFAULT_AFTER_S
