"""built_once (shared_build.py): what make test's xdist workers share is built once.

A pytest of its own, run with two xdist workers on four test files that all
need one session fixture built with ``built_once``; the build takes a second, so
both workers ask while it runs. Each build appends a line to a log, and each test
writes down the folder it was given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CONFTEST = f'''
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, {str(HERE)!r})
from shared_build import built_once


def _build(out: Path) -> None:
    with open(os.environ["BUILD_LOG"], "a") as log:
        log.write(f"{{os.environ.get('PYTEST_XDIST_WORKER')}}\\n")
    time.sleep(1)
    (out / "made").write_text("yes")


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "made", _build)
'''

TEST_FILE = '''
import os


def test_sees_the_build(made):
    assert (made / "made").read_text() == "yes"
    with open(os.environ["SEEN_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER')} {made}\\n")
'''


def test_two_workers_build_a_session_fixture_once(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (requirements/test.txt has it)")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for i in range(4):
        (suite / f"test_part{i}.py").write_text(TEST_FILE)
    build_log, seen_log = tmp_path / "builds", tmp_path / "seen"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(BUILD_LOG=str(build_log), SEEN_LOG=str(seen_log))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
         "--basetemp", str(tmp_path / "base"), str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout
    seen = [line.split(" ", 1) for line in seen_log.read_text().splitlines()]
    assert {worker for worker, _ in seen} == {"gw0", "gw1"}, "both workers should have run tests"
    assert len({folder for _, folder in seen}) == 1, seen
    assert len(build_log.read_text().splitlines()) == 1, build_log.read_text()
