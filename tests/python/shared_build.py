"""Test inputs built once per run, however many pytest-xdist workers need them.

make test runs pytest with two xdist workers, and each worker is a pytest
session of its own: a session-scoped fixture that compiles with TVM would
compile once per worker. ``built_once`` makes the first worker that asks build
and the others wait for it. Kept apart from conftest.py (and from TensorFlow)
so that test_shared_build.py can drive it in a pytest of its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder `build` fills, once per test run however many xdist workers ask.

    Without xdist it is a fresh temporary folder. With it, the folder sits in the
    temporary root the workers share; a lock file makes the first worker build
    while the others wait, and a marker written after a build that returned tells
    them it is complete (a failed build leaves none: the next worker tries again
    and fails the same way, with its own error)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    root = tmp_path_factory.getbasetemp().parent
    out, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out
