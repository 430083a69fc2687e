"""What a compile is doing, said to the user while it runs.

Each stage of a compile (trace, convert, import, schedule, compile, load, the
tuning trials) is a line logged at INFO on ``tf_op.compiler``, as ever. A
compile still running after ``TVMDSOOP_PROGRESS_AFTER_S`` seconds (default 3)
also prints them on stderr, the earlier ones first, each with the time since the
compile began: a quick compile says nothing, a slow one is never silent.
``TVMDSOOP_PROGRESS=0`` keeps them in the log only, ``=1`` prints every compile's.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TextIO

logger = logging.getLogger(__package__)

#: The compile time after which stage lines are printed too.
DEFAULT_AFTER_S = 3.0


class Progress:
    """The stage lines of one compile (``name``): logged, and printed on stderr
    once the compile has run longer than ``after_s``."""

    def __init__(self, name: str, after_s: float | None = None, stream: TextIO | None = None) -> None:
        setting = os.environ.get("TVMDSOOP_PROGRESS", "")
        if after_s is None:
            after_s = {"0": float("inf"), "1": 0.0}.get(setting, _env_seconds("TVMDSOOP_PROGRESS_AFTER_S"))
        self.name = name
        self._stream = stream
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._held: list[str] = []  # the lines said before the compile was slow enough to show them
        self._showing = after_s <= 0
        self._timer: threading.Timer | None = None
        if 0 < after_s < float("inf"):
            self._timer = threading.Timer(after_s, self._show)
            self._timer.daemon = True
            self._timer.start()

    def stage(self, message: str) -> None:
        """One stage's line: ``message`` (say what was done and in how long)."""
        logger.info("%s: %s", self.name, message)
        line = f"tf_op.compile({self.name}) {time.perf_counter() - self._start:6.1f} s: {message}"
        with self._lock:
            if self._showing:
                self._print(line)
            else:
                self._held.append(line)

    def close(self) -> None:
        """The compile ended: nothing more is printed for it."""
        if self._timer is not None:
            self._timer.cancel()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _show(self) -> None:
        with self._lock:
            self._showing = True
            for line in self._held:
                self._print(line)
            self._held.clear()

    def _print(self, line: str) -> None:
        stream = self._stream or sys.stderr
        print(line, file=stream, flush=True)


def _env_seconds(name: str) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else DEFAULT_AFTER_S
    except ValueError:
        logger.warning("%s=%r is not a number of seconds: using %s", name, value, DEFAULT_AFTER_S)
        return DEFAULT_AFTER_S
