"""The TVM worker of tf_op.compile is kept between compiles (tf_op/compiler/
worker.py): each compile after the first is spared the start of Python and
TVM. A kept worker must not change what a compile gives: it is another one
where the environment differs, a failed or killed one never takes the next
compile down with it, and none outlives its use (idle, the process's exit, a
fork)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TVM_PYTHON
from helpers import process_gone, run_python, wait_for

from tf_op import CompileError, compile
from tf_op.compiler import worker
from tf_op.compiler.progress import Progress

RTOL = ATOL = 1e-5


def _dense(units: int, seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(units, activation="tanh")])


def _check_compiles(model: keras.Model, cache_dir: Path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    got = compile(model, [tf.TensorSpec([3, 6])], cache_dir=cache_dir)(x).numpy()
    np.testing.assert_allclose(got, model(x).numpy(), rtol=RTOL, atol=ATOL)


def _kept_pids() -> list[int]:
    with worker._Server._lock:
        return [server.process.pid for idle in worker._Server._idle.values() for server in idle]


def _serving_children() -> list[int]:
    """This process's children that run ``compile_model.py --serve``, busy or not."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and b"--serve" in command:
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_kept_workers() -> None:
    worker._Server.close_all()
    yield
    worker._Server.close_all()


def test_compiles_share_a_worker_until_the_environment_changes(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _check_compiles(_dense(4, 0), tmp_path)
    (first,) = _kept_pids()
    _check_compiles(_dense(5, 1), tmp_path)
    assert _kept_pids() == [first], "the second compile started a worker of its own"
    # What a worker started for the compile would see differs: another worker,
    # and the one kept for the old environment goes.
    monkeypatch.setenv("TVMDSOOP_WORKER_TEST", "1")
    _check_compiles(_dense(6, 2), tmp_path)
    (second,) = _kept_pids()
    assert second != first
    assert wait_for(lambda: process_gone(first))


def _loaded(pid: int, library: str) -> bool:
    try:
        return library in Path("/proc", str(pid), "maps").read_text()
    except OSError:
        return False


def test_the_first_compile_s_worker_starts_before_the_conversion(tmp_path: Path) -> None:
    """The worker is started as the conversion to TFLite starts, and has
    imported TVM before any request: the first compile of a process no longer
    waits for that after the conversion. The compile takes that worker."""
    started: list[int] = []

    def tflite() -> bytes:
        started.extend(_kept_pids())
        assert len(started) == 1, started
        assert wait_for(lambda: _loaded(started[0], "libtvm_compiler.so"), 60), "the worker did not import TVM"
        return b"not a flatbuffer"

    with Progress("ahead", after_s=float("inf")) as progress, pytest.raises(CompileError):
        worker.compile_into(tflite, "portable", 0, worker.tvm_python(), tmp_path / "lib.so", progress)
    assert _kept_pids() == started
    _check_compiles(_dense(4, 0), tmp_path)
    assert _kept_pids() == started


def test_a_failed_compile_leaves_the_worker_serving(tmp_path: Path) -> None:
    _check_compiles(_dense(4, 0), tmp_path)
    (first,) = _kept_pids()
    lib = tmp_path / "garbage.so"
    with Progress("garbage", after_s=float("inf")) as progress, pytest.raises(
            CompileError, match=r"TVM could not compile the model \(target 'portable', exit 2\)"):
        worker.compile_into(lambda: b"not a flatbuffer", "portable", 0, worker.tvm_python(), lib, progress)
    assert not lib.exists()
    _check_compiles(_dense(5, 1), tmp_path)
    assert _kept_pids() == [first]


def test_a_worker_killed_while_idle_is_replaced(tmp_path: Path) -> None:
    _check_compiles(_dense(4, 0), tmp_path)
    (first,) = _kept_pids()
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: process_gone(first))
    _check_compiles(_dense(5, 1), tmp_path)
    assert len(_kept_pids()) == 1 and first not in _kept_pids()


def test_a_ctrl_c_between_compiles_leaves_the_worker(tmp_path: Path) -> None:
    """A Ctrl-C at a terminal reaches the whole process group, the kept worker
    too: between compiles it is the parent's to act on, not the worker's."""
    _check_compiles(_dense(4, 0), tmp_path)
    (first,) = _kept_pids()
    os.kill(first, signal.SIGINT)
    time.sleep(1)
    assert not process_gone(first)
    _check_compiles(_dense(5, 1), tmp_path)
    assert _kept_pids() == [first]


def test_a_worker_killed_in_a_compile_is_that_compile_s_error_only(tmp_path: Path) -> None:
    failures: list[BaseException] = []

    def compile_in_thread() -> None:
        try:
            _check_compiles(_dense(7, 3), tmp_path / "killed")
        except BaseException as err:  # noqa: BLE001 - checked below
            failures.append(err)

    thread = threading.Thread(target=compile_in_thread)
    thread.start()
    # Taken for the compile: no longer kept idle (it is started before the
    # conversion, and kept until the compile takes it: worker._Server.start_ahead).
    assert wait_for(lambda: bool(_serving_children()) and not _kept_pids(), 60), "no worker compiling"
    (busy,) = _serving_children()
    os.kill(busy, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], CompileError), failures
    assert f"exit {-signal.SIGKILL}" in str(failures[0])
    assert _kept_pids() == [], "a dead worker was kept"
    _check_compiles(_dense(7, 3), tmp_path / "again")


def test_an_idle_worker_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "IDLE_SECONDS", 0.2)
    _check_compiles(_dense(4, 0), tmp_path)
    (first,) = _kept_pids()
    assert wait_for(lambda: not _kept_pids() and process_gone(first))
    _check_compiles(_dense(5, 1), tmp_path)


_EXIT_SCRIPT = """
import json, os, signal, sys, threading
import numpy as np, tensorflow as tf
from tf_op import compile
from tf_op.compiler import worker

def kept():
    return [s.process.pid for idle in worker._Server._idle.values() for s in idle]

double = compile(lambda x: x * 2.0, [tf.TensorSpec([2], tf.float32)], cache_dir=sys.argv[1])
assert double(tf.constant([1.0, 2.0])).numpy().tolist() == [2.0, 4.0]
(parent_worker,) = kept()
# Another thread of the parent holds the workers' lock while it forks (taking
# or keeping a worker): in the child, no thread will release it.
holding, release = threading.Event(), threading.Event()

def hold():
    with worker._Server._lock:
        holding.set()
        release.wait()

holder = threading.Thread(target=hold)
holder.start()
holding.wait()
read, write = os.pipe()
child = os.fork()
if child == 0:  # the parent's worker is not the child's: it compiles with one of its own
    signal.alarm(60)  # a child that waits for the parent's lock forever
    os.close(read)
    triple = compile(lambda x: x * 3.0, [tf.TensorSpec([2], tf.float32)], cache_dir=sys.argv[1])
    os.write(write, json.dumps({"values": triple(tf.constant([1.0, 2.0])).numpy().tolist(),
                                "workers": kept()}).encode())
    os._exit(0)
release.set()
holder.join()
os.close(write)
with os.fdopen(read) as answer:
    from_child = json.loads(answer.read())
assert os.waitpid(child, 0)[1] == 0
halve = compile(lambda x: x * 0.5, [tf.TensorSpec([2], tf.float32)], cache_dir=sys.argv[1])
assert halve(tf.constant([1.0, 2.0])).numpy().tolist() == [0.5, 1.0]
print(json.dumps({"parent": parent_worker, "parent_after": kept(), "child": from_child}))
"""


def test_a_forked_child_has_workers_of_its_own_and_none_outlives_its_process(tmp_path: Path) -> None:
    run = run_python(_EXIT_SCRIPT, str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["child"]["values"] == [3.0, 6.0]
    assert got["parent_after"] == [got["parent"]], "the parent's worker did not serve it after the fork"
    (child_worker,) = got["child"]["workers"]
    assert child_worker != got["parent"]
    for pid in (got["parent"], child_worker):
        assert wait_for(lambda pid=pid: process_gone(pid), 10), f"worker {pid} outlived its process"


def test_a_served_request_that_is_not_a_compile_is_refused_and_the_next_served(tmp_path: Path) -> None:
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [tf.function(lambda x: x + 1.0).get_concrete_function(tf.TensorSpec([3], tf.float32))])
    (tmp_path / "model.tflite").write_bytes(converter.convert())
    request = json.dumps([str(tmp_path / "model.tflite"), str(tmp_path / "model.so"), json.dumps("portable")])
    served = subprocess.run([TVM_PYTHON, str(worker.script()), "--serve"], input=f"not json\n{request}\n",
                            capture_output=True, text=True, timeout=300)
    assert served.returncode == 0, served.stderr[-3000:]
    assert [line for line in served.stdout.splitlines() if line.startswith("tvmdsoop-done: ")] == [
        "tvmdsoop-done: 64", "tvmdsoop-done: 0"]
    assert "not a compile's arguments" in served.stderr
    assert (tmp_path / "model.so").stat().st_size > 0
