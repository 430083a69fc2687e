"""compile_model.export_levels: a portable library's higher levels built each by
a process of its own (``LevelProcess``) while the compile builds the baseline,
their failures reported by level, and none left building once the compile has
failed or been killed; ``TVMDSOOP_COMPILE_PROCESSES=1`` builds them one after
another, in the compile's process (the tests set 3 otherwise: the processes
run on a machine of any CPU count).

The levels are a one-line TVM kernel, built on the TVM Python (TVM_PYTHON) in a
child process, as the worker does: TVM and TensorFlow each bring an LLVM. That
script is a file, not ``-c``: multiprocessing's fork server imports the main
module's file in each process it starts, to find the functions it runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TVM_PYTHON
from helpers import process_gone, wait_for

import tf_op
from tf_op.compiler import tflite_conversion, worker

_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from functools import partial
    from pathlib import Path

    sys.path.insert(0, sys.argv[1])
    from tf_op_tvm import compile_model


    def build_level(level, wait_for=None):
        import tvm
        from tvm import te

        if wait_for is not None:  # the base level fails once the others are building
            while not all(Path(wait_for, f"{name}.pid").exists() for name in compile_model.X86_LEVELS[1:]):
                time.sleep(0.05)
            raise RuntimeError("the baseline cannot be built")
        target = tvm.target.Target(level)
        a = te.placeholder((8,), name="a")
        b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
        return tvm.compile(te.create_prim_func([a, b]).with_attr("global_symbol", "add_one"), target=target), target


    def build_apart(record_dir, behaviour, level, out_path):
        Path(record_dir, f"{level['mcpu']}.pid").write_text(str(os.getpid()))
        if behaviour == "raise" and level["mcpu"] == "x86-64-v4":
            raise ValueError("this level cannot be built")
        if behaviour == "die" and level["mcpu"] == "x86-64-v3":
            os.kill(os.getpid(), signal.SIGKILL)
        if behaviour in ("sleep", "base fails"):
            time.sleep(300)
        built, target = build_level(level)
        compile_model.export_recorded(built, target, out_path, out_path.parent)
        return {"compile_s": 1.5}


    if __name__ == "__main__":
        behaviour, out_dir = sys.argv[2], Path(sys.argv[3])
        base = partial(build_level, wait_for=out_dir) if behaviour == "base fails" else build_level
        try:
            figures = compile_model.export_levels(base, out_dir / "lib.so", compile_model.PORTABLE,
                                                  partial(build_apart, str(out_dir), behaviour))
        except Exception as err:
            print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        else:
            print(json.dumps({"figures": figures, "pid": os.getpid()}))
""")


def _start(tmp_path: Path, behaviour: str, processes: str = "3") -> subprocess.Popen[str]:
    script = tmp_path / "levels_check.py"
    script.write_text(_SCRIPT)
    environment = {**os.environ, "TVMDSOOP_COMPILE_PROCESSES": processes}
    # Run from tmp_path, where a tflite.py waits for a fork server that would
    # import from its working folder.
    (tmp_path / "tflite.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    return subprocess.Popen([TVM_PYTHON, str(script), str(worker.package_dir().parent), behaviour, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, cwd=tmp_path)


def _run(tmp_path: Path, behaviour: str, processes: str = "3") -> dict[str, object]:
    process = _start(tmp_path, behaviour, processes)
    try:
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _level_pids(tmp_path: Path) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in tmp_path.glob("*.pid") if path.read_text()}


def _parent(pid: int) -> int:
    return int(Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[1])


def _fork_servers(tmp_path: Path) -> list[int]:
    """multiprocessing's fork servers started by the script in ``tmp_path``
    (its folder is on the path each is started with), and the processes they
    forked, which keep their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and b"multiprocessing.forkserver" in command and str(tmp_path).encode() in command:
            found.append(int(entry.name))
    return found


def test_higher_levels_are_built_by_processes_of_their_own(tmp_path: Path) -> None:
    """Each higher level in a process of its own, its library embedded in the
    baseline's, its figures summed into the compile's."""
    result = _run(tmp_path, "ok")
    figures = result["figures"]
    assert figures["levels"] == ["x86-64-v3", "x86-64-v4"]
    assert figures["compile_s"] == 3.0
    assert figures["cpu_flags"] == []
    pids = _level_pids(tmp_path)
    assert sorted(pids) == ["x86-64-v3", "x86-64-v4"]
    assert len({result["pid"], *pids.values()}) == 3, (result["pid"], pids)
    symbols = subprocess.run(["nm", "--defined-only", str(tmp_path / "lib.so")], capture_output=True, text=True,
                             check=True).stdout.split()
    assert {"tvmdsoop_level_x86_64_v3", "tvmdsoop_level_x86_64_v4", "__tvm_ffi_add_one"} <= set(symbols), symbols
    assert not (tmp_path / "imported").exists(), "the fork server imported tflite.py from the working folder"


@pytest.mark.parametrize(("processes", "apart"), [("1", []), ("2", ["x86-64-v4"])])
def test_fewer_processes_build_the_other_levels_in_the_compile_s(tmp_path: Path, processes: str,
                                                                 apart: list[str]) -> None:
    """TVMDSOOP_COMPILE_PROCESSES (a machine short of memory) counts the
    compile's own process: with 1 every level is built there, one after
    another; with 2 the highest in a process of its own. The same library."""
    figures = _run(tmp_path, "ok", processes=processes)["figures"]
    assert figures["levels"] == ["x86-64-v3", "x86-64-v4"]
    assert figures["level_processes"] == len(apart) and figures["compile_s"] == 1.5 * len(apart)
    assert sorted(_level_pids(tmp_path)) == apart
    symbols = subprocess.run(["nm", "--defined-only", str(tmp_path / "lib.so")], capture_output=True, text=True,
                             check=True).stdout.split()
    assert {"tvmdsoop_level_x86_64_v3", "tvmdsoop_level_x86_64_v4", "__tvm_ffi_add_one"} <= set(symbols), symbols


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_process_count_that_is_not_one_is_refused(tmp_path: Path, value: str) -> None:
    assert _run(tmp_path, "ok", processes=value) == {
        "error": f"ValueError: TVMDSOOP_COMPILE_PROCESSES={value!r}: expected a whole number of processes, 1 or more"}


@pytest.mark.parametrize(("behaviour", "message"), [
    ("raise", "LevelProcessError: building for x86-64-v4: ValueError: this level cannot be built"),
    ("die", "LevelProcessError: building for x86-64-v3: its process ended with exit code -9 before it was done"),
])
def test_a_level_that_fails_is_the_compile_s_error(tmp_path: Path, behaviour: str, message: str) -> None:
    """A level's exception, or its process's death, fails the compile with an
    error that names the level; nothing waits on the dead process."""
    assert _run(tmp_path, behaviour) == {"error": message}
    assert not (tmp_path / "lib.so").exists()


def test_a_failed_baseline_leaves_no_level_building(tmp_path: Path) -> None:
    """The baseline's error ends the compile at once: the levels still
    building are stopped, not waited for."""
    started = time.monotonic()
    assert _run(tmp_path, "base fails") == {"error": "RuntimeError: the baseline cannot be built"}
    assert time.monotonic() - started < 60
    pids = _level_pids(tmp_path)
    assert len(pids) == 2 and all(process_gone(pid) for pid in pids.values()), pids


def test_a_dead_fork_server_leaves_no_level_building(tmp_path: Path) -> None:
    """The fork server killed (by the OOM killer, say) mid-build: multiprocessing
    then takes the levels' processes for ended, but the compile fails and
    ends them all the same."""
    process = _start(tmp_path, "sleep")
    try:
        assert wait_for(lambda: len(_level_pids(tmp_path)) == 2, 60), process.stderr
        # The server only: the processes it forked run its command line too.
        (server,) = {_parent(pid) for pid in _level_pids(tmp_path).values()}
        os.kill(server, signal.SIGKILL)
        out, err = process.communicate(timeout=60)
        assert "building for x86-64-v3: its process ended" in json.loads(out.strip().splitlines()[-1])["error"], err
        pids = _level_pids(tmp_path)
        assert wait_for(lambda: all(process_gone(pid) for pid in pids.values()), 20), pids
    finally:
        process.kill()
        process.communicate()
        for pid in _level_pids(tmp_path).values():
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_compile_leaves_no_level_building(tmp_path: Path) -> None:
    """A compile killed (the worker, when the compile is interrupted) takes its
    level processes with it, and multiprocessing's fork server goes too."""
    process = _start(tmp_path, "sleep")
    try:
        assert wait_for(lambda: len(_level_pids(tmp_path)) == 2, 60), process.stderr
        process.send_signal(signal.SIGKILL)
        process.wait()
        pids = _level_pids(tmp_path)
        assert wait_for(lambda: all(process_gone(pid) for pid in pids.values()), 20), pids
        assert wait_for(lambda: all(process_gone(pid) for pid in _fork_servers(tmp_path)), 20)
    finally:
        process.kill()
        process.communicate()
        for pid in [*_level_pids(tmp_path).values(), *_fork_servers(tmp_path)]:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("layers", "processes"), [(1, 0), (16, 2)], ids=["small", "many operations"])
def test_only_a_model_of_many_operations_has_its_levels_built_apart(tmp_path: Path, layers: int,
                                                                    processes: int) -> None:
    """A model's compile (compile_model.py, as the worker runs it) builds its
    levels in processes of their own only from ``LEVELS_APART_OPERATIONS``
    operations: a small model's levels cost less than the processes' start.
    Either way the library computes the model."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), *[keras.layers.Dense(8, activation="tanh") for _ in range(layers)]])
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(tf.TensorSpec([2, 8]))
    flatbuffer, library = tmp_path / "model.tflite", tmp_path / "model.so"
    flatbuffer.write_bytes(tflite_conversion.to_tflite(concrete, "dense"))
    run = subprocess.run([TVM_PYTHON, str(worker.script()), str(flatbuffer), str(library), '"portable"'],
                         capture_output=True, text=True, env={**os.environ, "TVMDSOOP_COMPILE_PROCESSES": "3"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["level_processes"] == processes
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    (y,) = tf_op.Module(str(library)).func("main", output_shapes=[[2, 8]], output_dtypes=["float32"])(x)
    np.testing.assert_allclose(y.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
