"""tf_op_tvm.winograd: 3x3 convolutions of stride 1 computed as Winograd's
F(m x m, 3 x 3) in untuned CPU libraries: which layers are converted and with
which m, the transforms scheduled by cpu_schedule.winograd, the values
numpy's within the issue's budget, ``TVMDSOOP_WINOGRAD=0``, and a Keras model
through tf_op.compile.

The checks that need TVM's compiler run on the TVM Python (TVM_PYTHON), in a
child process, as the worker does: TVM and TensorFlow each bring an LLVM.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_tvm_script
from test_cpu_schedule_conv import _LEVELS

from tf_op import CompileError, compile
from tf_op.compiler import cache, worker

#: Layers as (N, H, W, IC, OC, padding, stride, weight, epilogue) and the m
#: each is converted with (None: kept direct): tiles of 4 that fill the output,
#: tiles of 4 cut at both edges (26 x 23), a batch of 2 big enough for TVM's
#: threads, channels in vectors narrower than the target's (36 and 40: 4 and 8
#: lanes), tiles of 2 where 4 leave too few tiles (a batch of 2 small images;
#: "valid" padding), too few tiles for either, too few input channels, a
#: weight that is an input rather than a constant, padding on two sides only
#: (top, left, bottom, right), stride 2.
CASES = [
    ((1, 24, 24, 32, 64, 1, 1, "constant", "bias_relu"), 4),
    ((1, 26, 23, 48, 32, 1, 1, "constant", "bias_residual"), 4),
    ((2, 56, 56, 64, 64, 1, 1, "constant", "bias_relu"), 4),
    ((1, 24, 24, 36, 40, 1, 1, "constant", "bias_relu"), 4),
    ((2, 7, 9, 32, 32, 1, 1, "constant", "bias_residual"), 2),
    ((1, 14, 14, 32, 64, 0, 1, "constant", "none"), 2),
    ((1, 9, 9, 32, 32, 1, 1, "constant", "bias_relu"), None),
    ((1, 24, 24, 16, 64, 1, 1, "constant", "none"), None),
    ((1, 24, 24, 32, 64, 1, 1, "input", "none"), None),
    ((1, 24, 24, 32, 64, [1, 1, 0, 0], 1, "constant", "none"), None),
    ((1, 24, 24, 32, 64, 1, 2, "constant", "none"), None),
]

#: Output shapes (batch, height, width) and the m tile_size gives them: 4
#: where it leaves 32 tiles; 2 where 4 does not; neither where 2 leaves too
#: few (ResNet50's 7x7 at batch 1) or a tile would be mostly past the edge
#: (outputs of 2x2 or 1x1 in a big batch: enough tiles, no saving).
TILE_SIZES = [((1, 56, 56), 4), ((1, 28, 28), 4), ((1, 14, 14), 2), ((1, 7, 7), None), ((8, 7, 7), 4),
              ((32, 2, 2), 2), ((64, 1, 1), None)]

#: Run on the TVM Python: each case through compile_model's CPU pipeline, its
#: output against numpy's float64 convolution (relative to the output's largest
#: value), what the Winograd pass reported, and whether cpu_schedule took each
#: of its kernels.
_SCRIPT = """
import json, sys
import numpy as np, tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu
from tvm.s_tir import dlight
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import compile_model, cpu_schedule, winograd

def model(n, h, w, ic, oc, pad, stride, weight_kind, epilogue, rng):
    top, left, bottom, right = [pad] * 4 if isinstance(pad, int) else pad
    x = rng.standard_normal((n, h, w, ic)).astype("float32")
    wt = (rng.standard_normal((3, 3, ic, oc)) / np.sqrt(9 * ic)).astype("float32")
    bias = rng.standard_normal(oc).astype("float32")
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    oh, ow = (xp.shape[1] - 3) // stride + 1, (xp.shape[2] - 3) // stride + 1
    ref = sum(xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :] @ wt[i, j].astype(np.float64)
              for i in range(3) for j in range(3))
    residual = rng.standard_normal(ref.shape).astype("float32")
    bb = relax.BlockBuilder()
    params = [relax.Var("x", relax.TensorType(x.shape, "float32"))]
    values = [x]
    if weight_kind == "input":
        params.append(relax.Var("w", relax.TensorType(wt.shape, "float32")))
        values.append(wt)
    with bb.function("main", params):
        with bb.dataflow():
            weight = params[1] if weight_kind == "input" else relax.const(wt)
            y = bb.emit(relax.op.nn.conv2d(params[0], weight, strides=stride, padding=[top, left, bottom, right],
                                           data_layout="NHWC", kernel_layout="HWIO"))
            if epilogue.startswith("bias"):
                y = bb.emit(relax.op.add(y, relax.const(bias)))
                ref = ref + bias
            if epilogue == "bias_relu":
                y = bb.emit(relax.op.nn.relu(y))
                ref = np.maximum(ref, 0.0)
            if epilogue == "bias_residual":
                y = bb.emit(relax.op.add(y, relax.const(residual)))
                ref = ref + residual
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), values, ref

target = tvm.target.Target(json.loads(sys.argv[2]))
if sys.argv[3] == "tile_sizes":
    results, cases = [winograd.tile_size(*shape) for shape in json.loads(sys.argv[4])], []
else:
    results, cases = [], json.loads(sys.argv[3])
for case in cases:
    mod, values, ref = model(*case, np.random.default_rng(0))
    reported = []
    converted = winograd.winograd_convolutions(reported.append)(mod)
    with target:
        legal = tvm.transform.Sequential([*cpu.library_dispatch_passes(target), *cpu.legalize_passes(target),
                                          dlight.ApplyDefaultSchedule(*cpu_schedule.rules(target))])(converted)
    # The Winograd rule's marks: a tile's transform a row at a time (another
    # rule would have inlined those rows), each row a buffer on the stack,
    # not one allocated with a call.
    scheduled = {}
    for g, f in legal.functions.items():
        if isinstance(f, tvm.tirx.PrimFunc) and "winograd" in g.name_hint:
            sch = tvm.s_tir.Schedule(f)
            rows = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith("_rows")]
            scheduled[g.name_hint] = (bool(f.attrs.get("tirx.is_scheduled")) and len(rows) == 1
                                      and not allocates_workspace(f, g.name_hint, target))
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=compile_model.cpu_pipeline(target)),
                              tvm.cpu())
    y = vm["main"](*map(tvm.runtime.tensor, values)).numpy()
    results.append({"reported": reported, "scheduled": scheduled,
                    "error": float(np.abs(y - ref).max() / np.abs(ref).max())})
print(json.dumps(results))
"""


def _run_script(*arguments: str, **environment: str) -> list:
    return run_tvm_script(_SCRIPT, str(worker.package_dir().parent), *arguments, **environment)


def _run_cases(target: dict[str, str], cases: list[tuple], **environment: str) -> list[dict]:
    return _run_script(json.dumps(target), json.dumps(cases), **environment)


def test_tile_size_needs_enough_tiles_and_a_saving() -> None:
    shapes = [shape for shape, _ in TILE_SIZES]
    got = _run_script(json.dumps({"kind": "llvm"}), "tile_sizes", json.dumps(shapes))
    assert got == [m for _, m in TILE_SIZES], list(zip(shapes, got))


@pytest.mark.parametrize("mcpu", _LEVELS)
def test_3x3_convolutions_are_converted_where_they_gain_and_keep_their_values(mcpu: str) -> None:
    """For each vector width (SSE, AVX2, AVX-512): each layer is converted
    with the m its shape calls for, or kept; the transforms of a converted
    one are scheduled by cpu_schedule.winograd (a row of a tile's transform
    at a time, on the stack; the output transform with the epilogue fused); and every output is numpy's float64 convolution within
    1e-4 of its largest value, the issue's budget for a whole model's logits
    (a converted layer's rounding is about 1e-5)."""
    cases = [case for case, _ in CASES]
    for (case, m), got in zip(CASES, _run_cases({"kind": "llvm", "mcpu": mcpu}, cases), strict=True):
        want = [] if m is None else [f"computed 1 3x3 convolution as F({m}x{m}, 3x3)"]
        assert got["reported"] == want, (case, got)
        if m is not None:
            assert len(got["scheduled"]) == 2 and all(got["scheduled"].values()), (case, got)
            epilogue = case[-1]
            output = next(name for name in got["scheduled"] if "output" in name)
            assert ("add" in output) == (epilogue != "none"), (case, output)
        assert got["error"] < 1e-4, (case, got)


def test_winograd_off_keeps_every_convolution_direct() -> None:
    """``TVMDSOOP_WINOGRAD=0``: no layer converted, and each output is the
    direct convolution's, within float32 rounding of a sum of 9 x 64 terms."""
    cases = [case for case, m in CASES if m is not None]
    for case, got in zip(cases, _run_cases({"kind": "llvm", "mcpu": "x86-64"}, cases, TVMDSOOP_WINOGRAD="0"),
                         strict=True):
        assert got["reported"] == [], (case, got)
        assert got["error"] < 2e-6, (case, got)


def test_the_setting_is_part_of_the_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library compiled with ``TVMDSOOP_WINOGRAD=0`` is another cache entry
    than the default's: the setting changes the code. Set to 1, the default,
    it is the default's entry."""
    monkeypatch.delenv("TVMDSOOP_WINOGRAD", raising=False)
    default = cache.key("model", "portable", 0, "0.27")
    monkeypatch.setenv("TVMDSOOP_WINOGRAD", "1")
    assert cache.key("model", "portable", 0, "0.27") == default
    monkeypatch.setenv("TVMDSOOP_WINOGRAD", "0")
    assert cache.key("model", "portable", 0, "0.27") != default


def _residual_block() -> keras.Model:
    """A ResNet basic block on 24 x 24 x 32: two 3x3 convolutions of 64
    channels (one with relu, one with the residual add), a classifier."""
    keras.utils.set_random_seed(3)
    x = keras.Input((24, 24, 32))
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    h = keras.layers.Conv2D(64, 3, padding="same")(h)
    h = keras.layers.ReLU()(h + keras.layers.Conv2D(64, 1)(x))
    return keras.Model(x, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)))


def test_compiled_residual_block_matches_keras(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """tf_op.compile of a Keras residual block, default target: its two 3x3
    convolutions compiled as F(4x4, 3x3) (the worker says so), its logits
    Keras's within 1e-4 of the largest, eagerly and in a tf.function."""
    model = _residual_block()
    x = np.random.default_rng(0).standard_normal((2, 24, 24, 32)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="tf_op.compiler"):
        compiled = compile(model, cache_dir=tmp_path)
        eager = compiled(tf.constant(x)).numpy()
    assert any("2 3x3 convolutions as F(4x4, 3x3)" in r.getMessage() for r in caplog.records), caplog.text
    want = model(x, training=False).numpy()
    graph = tf.function(lambda t: compiled(t))(tf.constant(x)).numpy()
    for got in (eager, graph):
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_a_setting_that_is_not_0_or_1_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TVMDSOOP_WINOGRAD=no`` is not read as on or off: the compile fails,
    naming the variable and what it takes."""
    monkeypatch.setenv("TVMDSOOP_WINOGRAD", "no")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    with pytest.raises(CompileError, match=r"TVMDSOOP_WINOGRAD='no': expected 1 .* or 0"):
        compile(model, cache_dir=tmp_path)(tf.zeros((1, 8)))


def test_tuning_searches_the_products_and_keeps_the_transforms_default(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A tuned compile converts the convolutions before it extracts kernels:
    MetaSchedule searches the 5 kernels that are not Winograd's transforms
    (whose candidates, inlined whole and unrolled at random, took minutes each
    to build) and every one of the 9 keeps the faster schedule; the logits are
    Keras's."""
    model = _residual_block()
    x = np.random.default_rng(0).standard_normal((1, 24, 24, 32)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="tf_op.compiler"):
        tuned = compile(model, cache_dir=tmp_path, tune=8, batch_sizes=[1])
    assert "2 3x3 convolutions as F(4x4, 3x3)" in caplog.text, caplog.text
    assert "tuning 5 kernels, 8 trials in all" in caplog.text, caplog.text
    assert "tuned 9 of 9 kernels" in caplog.text, caplog.text
    want = model(x, training=False).numpy()
    assert np.abs(tuned(tf.constant(x)).numpy() - want).max() / np.abs(want).max() < 1e-4
