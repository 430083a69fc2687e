"""tf_op_tvm.cpu_schedule.conv: the register-tiled NHWC convolution schedules
of untuned CPU libraries take the convolutions, and keep their values.

The checks that need TVM's compiler run on the TVM Python (TVM_PYTHON), in a
child process, as the worker does: TVM and TensorFlow each bring an LLVM.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import host_cpu_flags, run_tvm_script

from tf_op import compile
from tf_op.compiler import worker

#: The tf_op_tvm package's folder (the worker's), found as tf_op.compile finds it.
TVM_PACKAGE = worker.package_dir()

#: Convolutions as (N, H, W, IC, OC, kernel, stride, depthwise, epilogue): 1x1
#: (a GEMM), 3x3 with padding, strided, depthwise, a channel count that is no
#: whole number of vectors, weights bigger than the input (packed; with images
#: too big to pass a channel tile all at once: one at a time), and each
#: epilogue: none, bias + relu6, bias + residual add.
CASES = [
    (1, 9, 9, 16, 32, 1, 1, False, "bias_relu6"),
    (2, 7, 14, 24, 48, 3, 1, False, "bias_relu6"),
    (1, 15, 15, 3, 32, 3, 2, False, "bias_relu6"),
    (1, 4, 4, 64, 96, 3, 1, False, "bias_residual"),
    (3, 20, 20, 256, 256, 3, 1, False, "bias_relu6"),
    (1, 8, 8, 40, 24, 1, 1, False, "none"),
    (1, 12, 12, 48, 48, 3, 1, True, "bias_relu6"),
    (2, 11, 11, 32, 32, 3, 2, True, "bias_relu6"),
    (1, 9, 9, 40, 40, 5, 1, True, "none"),
]

#: The same layers with their weights as inputs of the function, as tf_op.auto's
#: clusters get Keras weights, in the form TF's TFLite converter and TVM's
#: frontend give them: the weight transposed to TFLite's layout and back (a
#: depthwise one reshaped), and batch norm ("bn": on its moving mean and
#: variance, gamma and beta, all inputs) as TFLite computes it, its scale before
#: the convolution and its shift after it.
RUNTIME_CASES = [
    (1, 9, 9, 16, 32, 1, 1, False, "bn_relu6"),
    (2, 7, 14, 24, 48, 3, 1, False, "bn"),
    (1, 15, 15, 3, 32, 3, 2, False, "bn_relu6"),
    (3, 20, 20, 256, 256, 3, 1, False, "bn_relu6"),
    (1, 8, 8, 40, 24, 1, 1, False, "none"),
    (1, 12, 12, 48, 48, 3, 1, True, "bn_relu6"),
    (2, 11, 11, 32, 32, 3, 2, True, "bn"),
]

#: Run on the TVM Python: each case through compile_model's Relax rewrites and
#: CPU pipeline for one target, against numpy's float64 result (relative to the
#: output's largest value), whether the conv rule took its PrimFunc, and the
#: names of the model's kernels.
_CONV_CASES = """
import json, sys
import numpy as np, tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu
from tvm.s_tir import dlight
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import compile_model, weight_layouts
from tf_op_tvm.cpu_schedule import conv

def model(n, h, w, ic, oc, k, s, dw, epilogue, rng, runtime):
    p = (k - 1) // 2
    pads = (p, p, p, p) if s == 1 else (0, 0, p, p)  # (top, left, bottom, right): strided, only after, as TF does
    x = rng.standard_normal((n, h, w, ic)).astype("float32")
    oc = ic if dw else oc
    wt = rng.standard_normal((k, k, ic, 1) if dw else (k, k, ic, oc)).astype("float32")
    bias = rng.standard_normal(oc).astype("float32")
    mean, gamma, beta = (rng.standard_normal(oc).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 2.0, oc).astype("float32")
    xp = np.pad(x.astype(np.float64), ((0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)))
    oh, ow = (xp.shape[1] - k) // s + 1, (xp.shape[2] - k) // s + 1
    ref = np.zeros((n, oh, ow, oc))
    for i in range(k):
        for j in range(k):
            patch = xp[:, i:i + s * oh:s, j:j + s * ow:s, :]
            ref += patch * wt[i, j, :, 0] if dw else patch @ wt[i, j].astype(np.float64)
    residual = rng.standard_normal(ref.shape).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    inputs, values = [xv], [x]
    if runtime:
        names = ["w", "mean", "var", "gamma", "beta"] if epilogue.startswith("bn") else ["w"]
        arrays = dict(w=wt, mean=mean, var=var, gamma=gamma, beta=beta)
        params = {name: relax.Var(name, relax.TensorType(arrays[name].shape, "float32")) for name in names}
        inputs += params.values()
        values += [arrays[name] for name in names]
    with bb.function("main", inputs):
        with bb.dataflow():
            if runtime and dw:  # DEPTHWISE_CONV_2D's 1HWC, and back
                weight = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(params["w"], (1, k, k, ic))), wt.shape))
            elif runtime:  # CONV_2D's OHWI, and back
                weight = bb.emit(relax.op.permute_dims(bb.emit(relax.op.permute_dims(params["w"], [3, 0, 1, 2])),
                                                       [1, 2, 3, 0]))
            else:
                weight = relax.const(wt)
            if epilogue.startswith("bn"):
                eps = relax.const(np.float32(1e-3))
                scale = bb.emit(relax.op.multiply(bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(params["var"], eps)))),
                                                  params["gamma"]))
            y = bb.emit(relax.op.nn.conv2d(xv, weight, strides=s, padding=pads, groups=ic if dw else 1,
                                           data_layout="NHWC", kernel_layout="HWOI" if dw else "HWIO"))
            if epilogue.startswith("bn"):
                y = bb.emit(relax.op.multiply(y, scale))
                shift = bb.emit(relax.op.subtract(params["beta"], bb.emit(relax.op.multiply(params["mean"], scale))))
                y = bb.emit(relax.op.add(y, shift))
                ref = (ref - mean) * gamma / np.sqrt(var.astype(np.float64) + 1e-3) + beta
            elif epilogue != "none":
                y = bb.emit(relax.op.add(y, relax.const(bias)))
                ref = ref + bias
            if epilogue.endswith("relu6"):
                y = bb.emit(relax.op.clip(y, 0.0, 6.0))
                ref = np.clip(ref, 0.0, 6.0)
            if epilogue == "bias_residual":
                y = bb.emit(relax.op.add(y, relax.const(residual)))
                ref = ref + residual
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return weight_layouts.simplify(bb.get()), values, ref  # as compile_model.compile_tflite does

target = tvm.target.Target(json.loads(sys.argv[2]))
results = []
for case in json.loads(sys.argv[3]):
    mod, values, ref = model(*case, np.random.default_rng(0), sys.argv[4] == "runtime")
    with target:
        legal = tvm.transform.Sequential([*cpu.library_dispatch_passes(target), *cpu.legalize_passes(target),
                                          dlight.ApplyDefaultSchedule(*conv.rules(target))])(mod)
    kernels = [g.name_hint for g, f in legal.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    taken = [bool(legal[name].attrs.get("tirx.is_scheduled")) for name in kernels if "conv2d" in name]
    # The ranks of the convolution's parameters after the CPU pipeline: 5 for a weight packed at compile time.
    lowered = compile_model.cpu_pipeline(target)(mod)
    ranks = [[len(p.shape) for p in f.params] for g, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in g.name_hint]
    # Whether the convolution's own code allocates with a call (its tile, its packed weights).
    workspace = [allocates_workspace(legal[name], name, target) for name in kernels if "conv2d" in name]
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=compile_model.cpu_pipeline(target)),
                              tvm.cpu())
    y = vm["main"](*map(tvm.runtime.tensor, values)).numpy()
    parallel = ["T.parallel(" in legal[name].script() for name in kernels if "conv2d" in name]
    results.append({"taken": taken, "kernels": kernels, "error": float(np.abs(y - ref).max() / np.abs(ref).max()),
                    "workspace": workspace, "ranks": ranks,
                    "parallel": parallel})
print(json.dumps(results))
"""


def _run_cases(target: dict[str, str], cases: list[tuple], weights: str) -> list[dict]:
    # The direct convolutions' schedules are what these cases test: Winograd's
    # (test_winograd.py) would take the 3x3 ones of stride 1 with many channels.
    return run_tvm_script(_CONV_CASES, str(TVM_PACKAGE.parent), json.dumps(target), json.dumps(cases), weights,
                          TVMDSOOP_WINOGRAD="0")


_HOST = host_cpu_flags()


#: One case per vector width (SSE, AVX2, AVX-512), where this CPU runs it.
_LEVELS = [
    "x86-64",
    pytest.param("x86-64-v3", marks=pytest.mark.skipif(not {"avx2", "fma"} <= _HOST, reason="runs AVX2 code")),
    pytest.param("x86-64-v4", marks=pytest.mark.skipif("avx512f" not in _HOST, reason="runs AVX-512 code")),
]


@pytest.mark.parametrize("mcpu", _LEVELS)
def test_conv_rule_takes_each_convolution_and_keeps_its_values(mcpu: str) -> None:
    """For each vector width (SSE, AVX2, AVX-512): every case's fused
    convolution PrimFunc is scheduled by the conv rule, and the library's
    output is numpy's within float32 rounding, on two of TVM's threads (the
    bigger cases split their loops over them)."""
    target = {"kind": "llvm", "mcpu": mcpu}
    for case, got in zip(CASES, _run_cases(target, CASES, "constant"), strict=True):
        assert got["taken"] == [True], (case, got)
        assert got["error"] < 1e-4, (case, got)  # float32 sums of up to 2304 terms


@pytest.mark.parametrize("mcpu", _LEVELS)
def test_conv_rule_takes_convolutions_whose_weights_are_inputs(mcpu: str) -> None:
    """Weights and batch norm statistics as inputs: the weight reaches the
    convolution with no copy (the transposes and reshapes TFLite and TVM's
    frontend put around it undone: no kernel but the convolution), the conv
    rule takes every convolution with batch norm's per-channel math fused, and
    the values are numpy's."""
    target = {"kind": "llvm", "mcpu": mcpu}
    for case, got in zip(RUNTIME_CASES, _run_cases(target, RUNTIME_CASES, "runtime"), strict=True):
        assert got["taken"] == [True], (case, got)
        assert not [name for name in got["kernels"] if "transpose" in name or "reshape" in name], (case, got)
        assert got["error"] < 1e-4, (case, got)


#: Convolutions like the Keras CNN's at batch 4 (3 -> 8 channels, 32x32; 8 ->
#: 16, 14x14), with an epilogue and without: register tiles of 16 columns by 8
#: lanes and of 14 columns by 16 lanes, under 1 KiB, and weights smaller than
#: an image (not packed).
SMALL_TILE_CASES = [
    (4, 32, 32, 3, 8, 3, 1, False, "bias_relu6"),
    (4, 14, 14, 8, 16, 3, 1, False, "bias_relu6"),
    (4, 14, 14, 8, 16, 3, 1, False, "none"),
]


@pytest.mark.skipif("avx512f" not in _HOST, reason="runs AVX-512 code")
def test_small_conv_tiles_stay_off_the_workspace_allocator() -> None:
    """A register tile under 1 KiB is a buffer TVM puts on the stack (and LLVM
    in registers), not one it allocates with a call of TVMBackendAllocWorkspace
    for every row of tiles; the values are numpy's."""
    target = {"kind": "llvm", "mcpu": "x86-64-v4"}
    for case, got in zip(SMALL_TILE_CASES, _run_cases(target, SMALL_TILE_CASES, "constant"), strict=True):
        assert got["taken"] == [True] and got["workspace"] == [False], (case, got)
        assert got["error"] < 1e-4, (case, got)


#: The small CNN's first convolution at batch 1 (32x32 images, 3 -> 8 channels:
#: 221k multiply-adds, over conv.PARALLEL_MIN_MULTIPLY_ADDS) and the same on 16x16
#: images (55k, under it).
THREADED_CASE = (1, 32, 32, 3, 8, 3, 1, False, "bias_relu6")
SERIAL_CASE = (1, 16, 16, 3, 8, 3, 1, False, "bias_relu6")


def test_convolutions_of_enough_multiply_adds_run_on_tvms_threads() -> None:
    """What splits a convolution over TVM's threads is its multiply-adds, not
    its outputs: the 221k of a small CNN's first layer (8192 outputs) do, 55k do
    not; the values are numpy's either way."""
    threaded, serial = _run_cases({"kind": "llvm", "mcpu": "x86-64"}, [THREADED_CASE, SERIAL_CASE], "constant")
    assert threaded["parallel"] == [True] and serial["parallel"] == [False], (threaded, serial)
    assert threaded["error"] < 1e-4 and serial["error"] < 1e-4, (threaded, serial)


#: A layer whose weights (2.4 MB) outsize its input (83 KB a padded image),
#: whose weight the conv rule repacks, and one whose weights do not.
PACKED_CASE = (2, 7, 7, 256, 256, 3, 1, False, "bias_relu6")
UNPACKED_CASE = (1, 8, 8, 40, 24, 1, 1, False, "none")


@pytest.mark.skipif("avx512f" not in _HOST, reason="runs AVX-512 code")
def test_constant_weights_are_packed_at_compile_time() -> None:
    """A constant weight that the conv rule repacks is packed once, when the
    library is compiled: the convolution's function takes it as a 5-D
    constant ([OC / tile][KH][KW][IC][tile]), with no copy per call. A weight
    that is an input is still packed per call, one channel tile at a time (its
    function takes the 4-D input); the values are numpy's either way."""
    target = {"kind": "llvm", "mcpu": "x86-64-v4"}
    (packed, unpacked), (runtime,) = (_run_cases(target, [PACKED_CASE, UNPACKED_CASE], "constant"),
                                      _run_cases(target, [PACKED_CASE], "runtime"))
    assert 5 in packed["ranks"][0] and 5 not in unpacked["ranks"][0] and 5 not in runtime["ranks"][0], (
        packed, unpacked, runtime)
    assert max(packed["error"], unpacked["error"], runtime["error"]) < 1e-4, (packed, unpacked, runtime)


def _mobile_block() -> keras.Model:
    """MobileNetV2's and ResNet's layers in small: a strided 3x3 stem, batch
    norm, relu6, 1x1 expansion, depthwise 3x3, 1x1 projection, a residual add."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((20, 20, 3))
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    y = keras.layers.ReLU(6.0)(keras.layers.Conv2D(48, 1)(x))
    y = keras.layers.ReLU(6.0)(keras.layers.DepthwiseConv2D(3, padding="same")(y))
    y = keras.layers.Conv2D(16, 1)(y)
    x = keras.layers.Add()([x, y])
    x = keras.layers.Conv2D(24, 3, strides=2, padding="valid", activation="relu")(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


def test_compiled_conv_block_matches_keras(tmp_path: Path) -> None:
    """tf_op.compile of the block (batch norm folded, so weights are not
    Keras's initial ones) gives Keras's values."""
    model = _mobile_block()
    model.layers[2].set_weights([w + np.random.default_rng(3).uniform(0.5, 1.5, w.shape).astype("float32")
                                 for w in model.layers[2].get_weights()])
    x = np.random.default_rng(0).standard_normal((3, 20, 20, 3)).astype(np.float32)
    expected = model(x, training=False).numpy()
    fast = compile(model, [tf.TensorSpec([None, 20, 20, 3])], cache_dir=tmp_path)
    np.testing.assert_allclose(fast(x).numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
