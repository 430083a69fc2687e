"""tf_op_tvm.cpu_schedule.pool: the NHWC pooling schedule of untuned CPU
libraries takes max and average pools, with their padding and epilogue, and
keeps their values.

The checks that need TVM's compiler run on the TVM Python (TVM_PYTHON), in a
child process, as the worker does: TVM and TensorFlow each bring an LLVM.
"""

from __future__ import annotations

import json

import pytest
from helpers import run_tvm_script
from test_cpu_schedule_conv import _LEVELS, TVM_PACKAGE

#: Pools as (kind, N, H, W, C, window, stride, padding, relu): the Keras CNN's
#: 2x2 max pool (channels half a vector on AVX-512), ResNet's padded 3x3
#: stride-2 one, average pools (a division after the window: the epilogue),
#: padded ones whose windows at the edges hold fewer values (divided by the
#: count of real ones, as TF's "same" average pool does), a relu fused behind,
#: a channel count that is no whole number of vectors, and channels too few
#: for a vector (left to the fallback).
CASES = [
    ("max", 3, 12, 12, 8, 2, 2, 0, False),
    ("max", 2, 15, 15, 64, 3, 2, 1, False),
    ("avg", 2, 10, 10, 24, 2, 2, 0, False),
    ("avg", 1, 9, 9, 16, 3, 1, 1, False),
    ("max", 2, 8, 8, 36, 2, 1, 0, True),
    ("avg", 2, 7, 7, 40, 3, 2, 1, True),
    ("max", 2, 6, 6, 3, 2, 2, 0, False),
]

#: Run on the TVM Python: each case through compile_model's CPU pipeline for
#: one target, against numpy's float64 result (relative to the output's
#: largest value), and whether the default rules (the pool rule: no other takes a
#: pool) scheduled its PrimFunc.
_POOL_CASES = """
import json, sys
import numpy as np, tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu
from tvm.s_tir import dlight
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import compile_model, cpu_schedule

def model(kind, n, h, w, c, k, s, p, relu, rng):
    x = rng.standard_normal((n, h, w, c)).astype("float32")
    xp = np.pad(x.astype(np.float64), ((0, 0), (p, p), (p, p), (0, 0)), constant_values=np.nan)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    windows = np.stack([xp[:, i:i + s * oh:s, j:j + s * ow:s, :] for i in range(k) for j in range(k)])
    ref = np.nanmax(windows, axis=0) if kind == "max" else np.nanmean(windows, axis=0)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
            extra = {} if kind == "max" else {"count_include_pad": False}
            y = bb.emit(op(xv, pool_size=k, strides=s, padding=p, layout="NHWC", **extra))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
                ref = np.maximum(ref, 0.0)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), x, ref

target = tvm.target.Target(json.loads(sys.argv[2]))
results = []
for case in json.loads(sys.argv[3]):
    mod, x, ref = model(*case, np.random.default_rng(0))
    with target:
        legal = tvm.transform.Sequential([*cpu.library_dispatch_passes(target), *cpu.legalize_passes(target),
                                          dlight.ApplyDefaultSchedule(*cpu_schedule.rules(target))])(mod)
    pools = [(g.name_hint, f) for g, f in legal.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "pool" in g.name_hint]
    taken = [bool(f.attrs.get("tirx.is_scheduled")) for _, f in pools]
    # Whether the pool's own code allocates a buffer (an epilogue's row) with a call.
    workspace = [allocates_workspace(f, name, target) for name, f in pools]
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=compile_model.cpu_pipeline(target)),
                              tvm.cpu())
    y = vm["main"](tvm.runtime.tensor(x)).numpy()
    results.append({"taken": taken, "workspace": workspace,
                    "error": float(np.abs(y - ref).max() / np.abs(ref).max())})
print(json.dumps(results))
"""


@pytest.mark.parametrize("mcpu", _LEVELS)
def test_pool_rule_takes_each_pool_and_keeps_its_values(mcpu: str) -> None:
    """For each vector width (SSE, AVX2, AVX-512): every pool whose channels
    fill a vector of 4 lanes or more is scheduled by the pool rule, the others
    are left to the fallback, and the library's output is numpy's within
    float32 rounding, on two of TVM's threads. The rows that an epilogue reads
    (under 1 KiB here) are buffers on the stack, not ones allocated with a call
    of TVMBackendAllocWorkspace."""
    target = {"kind": "llvm", "mcpu": mcpu}
    results = run_tvm_script(_POOL_CASES, str(TVM_PACKAGE.parent), json.dumps(target), json.dumps(CASES))
    for case, got in zip(CASES, results, strict=True):
        assert got["taken"] == [case[4] % 4 == 0] and got["workspace"] == [False], (case, got)
        assert got["error"] < 1e-5, (case, got)  # a max is exact; a mean of at most 9 terms
