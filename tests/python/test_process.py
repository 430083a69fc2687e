"""Process-level behaviour: multiprocessing after the op library (and its Go
runtime) is loaded, and device placement rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_op

CHILD_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys

    import tensorflow as tf
    import tf_op

    LIB = sys.argv[2]

    def child(q):
        # A function the parent never ran: its kernel is constructed (Go runs) here.
        fn = tf_op.Module(LIB).func("vector_add")
        q.put(fn(tf.constant([1.0, 2.0]), tf.constant([10.0, 20.0])).numpy().tolist())

    if __name__ == "__main__":
        print(tf_op.Module(LIB).func("add_one")(tf.constant([0.0])).numpy().tolist())
        ctx = mp.get_context(sys.argv[1])
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(120)
        if p.exitcode is None:
            p.kill()
        print("child", p.exitcode, q.get(timeout=5) if p.exitcode == 0 else None)
        # The parent still works whatever happened to the child.
        print(tf_op.Module(LIB).func("add_one")(tf.constant([1.0])).numpy().tolist())
    """
)


def run_child(tmp_path, testlib: str, method: str) -> list[str]:
    script = tmp_path / "mp_child.py"
    script.write_text(CHILD_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), method, testlib], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_multiprocessing_spawn(tmp_path, testlib: str) -> None:
    """The documented way: a spawned child loads its own op library."""
    assert run_child(tmp_path, testlib, "spawn") == ["[1.0]", "child 0 [11.0, 22.0]", "[2.0]"]


def test_multiprocessing_fork_never_harms_the_parent(tmp_path, testlib: str) -> None:
    """Go does not support fork without exec (golang/go 15538), so fork is
    documented as unsupported; what must hold is that the parent lives on and a
    child that does answer answers right."""
    first, child, last = run_child(tmp_path, testlib, "fork")
    assert first == "[1.0]" and last == "[2.0]"
    # The child either answers right, or fails visibly (a non-zero exit or a
    # signal, which the parent sees); never a wrong answer or a silent success.
    _, code, answer = child.split(" ", 2)
    assert (code, answer) == ("0", "[11.0, 22.0]") or (code != "0" and answer == "None"), child


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="needs a machine with no GPU visible to TF")
def test_strict_placement_on_a_missing_device(testlib: str) -> None:
    fn = tf_op.Module(testlib).func("add_one", device="/GPU:0")
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="Could not satisfy device specification"):
            fn(tf.constant([1.0]))
    finally:
        tf.config.set_soft_device_placement(soft)
    np.testing.assert_array_equal(fn(tf.constant([1.0])).numpy(), [2.0])


def test_tf1_session_placement(testlib: str) -> None:
    fn = tf_op.Module(testlib).func("add_one", device="/GPU:0")
    with tf.Graph().as_default() as g:
        y = fn(tf.constant([1.0]))
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        with tf.compat.v1.Session(graph=g, config=config) as sess:
            np.testing.assert_array_equal(sess.run(y), [2.0])


THREAD_SETTINGS_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import json
    import sys

    import tensorflow as tf
    import tf_op

    tf_op.Module(sys.argv[1]).func("add_one")(tf.constant([0.0]))
    getenv = ctypes.CDLL(None).getenv  # the C environment TVM reads, not Python's copy of it
    getenv.restype = ctypes.c_char_p
    names = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS")
    print(json.dumps({name: (getenv(name.encode()) or b"").decode() for name in names}))
    """
)


@pytest.mark.parametrize(
    "user, expected",
    [
        ({}, {"TVM_NUM_THREADS": "cpus", "TVM_THREAD_POOL_SPIN_COUNT": "200", "TVM_BIND_THREADS": "0"}),
        (
            {"TVM_NUM_THREADS": "3", "TVM_THREAD_POOL_SPIN_COUNT": "1000", "TVM_BIND_THREADS": "1"},
            {"TVM_NUM_THREADS": "3", "TVM_THREAD_POOL_SPIN_COUNT": "1000", "TVM_BIND_THREADS": "1"},
        ),
    ],
    ids=["defaults", "the user's kept"],
)
def test_tvm_thread_settings(tmp_path, testlib: str, user: dict[str, str], expected: dict[str, str]) -> None:
    """TVM's pool runs beside TF's threads: as many threads as the process may
    use, a short spin before they sleep, no pinning, unless the user set otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TVM_")} | user
    script = tmp_path / "thread_settings.py"
    script.write_text(THREAD_SETTINGS_SCRIPT)
    done = subprocess.run([sys.executable, str(script), testlib], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    cpus = str(len(os.sched_getaffinity(0)))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {k: cpus if v == "cpus" else v for k, v in expected.items()}
