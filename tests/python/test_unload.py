"""Issue 41's goal on the op path: a server that loads 40 versions of a 16 MiB
model, one after another (a SavedModel each: loaded, run, dropped), holds
about one version's memory, not forty. The kernels give back what they loaded
when TF destroys them, and the library leaves with its last kernel: a loaded
SavedModel's and a tf.function's when they are collected, an eager op's when
TF's eager kernel cache is cleared.

Runs in a fresh interpreter, so that what it measures is its own: RSS plus
the bytes of the process's memfds (a loaded library's sealed copy)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import MODULES_DIR, TVM_PYTHON
from helpers import run_python

VERSIONS = 40
MIB = 1 << 20

# argv: the folder of weights.so and weights.json, a scratch folder, the mode.
SCRIPT = r"""
import gc, json, os, shutil, sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
import tf_op

built, scratch, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
layout = json.loads((built / "weights.json").read_text())
library = bytearray((built / "weights.so").read_bytes())
first_row = np.frombuffer(library, np.float32, layout["cols"], layout["offset"]).copy()
x = np.zeros((1, layout["rows"]), np.float32)
x[0, 0] = 1  # x @ W is W's row 0


def version(v):
    # W[0,0] = v: another digest, another W (build_weights_model.py).
    library[layout["offset"]:layout["offset"] + 4] = np.float32(v).tobytes()
    path = scratch / f"model_v{v}.so"
    path.write_bytes(library)
    return path


def footprint():
    gc.collect()
    rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) << 10
    memfds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                memfds += os.stat(f"/proc/self/fd/{fd}").st_size
        except OSError:
            pass  # closed since listed (the listing's own fd)
    return rss + memfds


def memfds_named(prefix):
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:" + prefix):
            names.append(target)
    return names


def saved_model(v):
    # A server's version: a SavedModel, saved by another process in practice.
    module = tf.Module()
    # Tracked, so that the SavedModel copies the library as its asset.
    module.fn = tf_op.Module(version(v)).func("main", output_shape=[1, layout["cols"]])
    module.serve = tf.function(module.fn, input_signature=[tf.TensorSpec([1, layout["rows"]], tf.float32)])
    out = scratch / f"saved_v{v}"
    tf.saved_model.save(module, str(out))
    os.remove(scratch / f"model_v{v}.so")  # the SavedModel's asset is its own copy
    return out


def run_saved_model(v):
    out = saved_model(v)
    loaded = tf.saved_model.load(str(out))
    row = loaded.serve(tf.constant(x)).numpy()[0]
    loaded_footprint = footprint()
    del loaded
    return row, out, loaded_footprint


def run_eager(v):
    path = version(v)
    fn = tf_op.Module(path).func("main", output_shape=[1, layout["cols"]])
    row = fn(tf.constant(x)).numpy()[0]
    loaded_footprint = footprint()
    del fn
    # TF's eager kernel cache keeps an eager op's kernel until it is cleared.
    context.context().clear_kernel_cache()
    return row, path, loaded_footprint


def run_function(v):
    path = version(v)
    fn = tf.function(tf_op.Module(path).func("main", output_shape=[1, layout["cols"]]))
    row = fn(tf.constant(x)).numpy()[0]
    loaded_footprint = footprint()
    del fn  # its graphs, and their kernels, go with it
    return row, path, loaded_footprint


run = {"saved_model": run_saved_model, "eager": run_eager, "function": run_function}[mode]
run(0)  # the first version warms up what stays: TF's functions, TVM's runtime, the probe
gc.collect()
before = footprint()
peak = 0
for v in range(1, %(versions)d + 1):
    row, leftover, loaded_footprint = run(v)
    assert row[0] == v, (v, row[0])
    assert np.array_equal(row[1:], first_row[1:]), v
    peak = max(peak, loaded_footprint)
    if leftover.is_dir():
        shutil.rmtree(leftover)
    else:
        os.remove(leftover)
gc.collect()
after = footprint()
print(json.dumps({"before": before, "peak": peak, "after": after, "memfds": memfds_named("tvmdsoop:model_v")}))
"""


@pytest.fixture(scope="module")
def weights_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/modules/build_weights_model.py's 16 MiB model, built once."""
    out = tmp_path_factory.mktemp("weights_model")
    subprocess.run([TVM_PYTHON, str(MODULES_DIR / "build_weights_model.py"), str(out)], check=True)
    return out


@pytest.mark.parametrize("mode", ["saved_model", "function", "eager"])
def test_forty_model_versions_leave(weights_model: Path, tmp_path: Path, mode: str) -> None:
    result = run_python(SCRIPT % {"versions": VERSIONS}, str(weights_model), str(tmp_path), mode)
    assert result.returncode == 0, result.stderr[-4000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    growth = got["after"] - got["before"]
    print(f"{VERSIONS} versions of a 16 MiB model ({mode}): footprint {got['before'] / MIB:.1f} MiB before, "
          f"{got['peak'] / MIB:.1f} MiB at the peak (one version loaded), {got['after'] / MIB:.1f} MiB after: growth {growth / MIB:.1f} MiB")
    assert got["memfds"] == [], "every version's memfd closed"
    assert growth < 150 * 1000 * 1000, "growth of RSS plus memfds"
