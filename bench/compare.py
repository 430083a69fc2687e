"""Runs one comparison in this process and writes its figures as flat JSON.

    python bench/compare.py {overhead,overhead_grappler,py_function,large} LIB OUT.json [--rounds N]
    python bench/compare.py model MODELS_DIR OUT.json [--rounds N]
    python bench/compare.py bridge CACHE_DIR OUT.json [--rounds N]

bench/run.py starts one process per comparison, so that contenders compared with
each other share a process (and are timed interleaved, see timing.py) and no
comparison inherits another's allocator or cache state. TVM's compiler is never
imported here: the TVM function is called through the tvm_ffi runtime only (the
bridge comparison's tf_op.compile runs TVM in child processes).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from common import (
    CHAIN,
    LARGE_KEY_SIZE,
    LARGE_SIZES,
    MODEL_BATCHES,
    MODEL_CHAIN,
    PY_FUNCTION_SIZE,
    VM_DIRECT,
    aligned_empty,
    quiet_tensorflow,
)

quiet_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tvm_ffi  # noqa: E402

import tf_op  # noqa: E402
from timing import SelfTimed, Timings, interleave, quartiles  # noqa: E402

Results = dict[str, float | int | str]
UnaryOp = Callable[[tf.Tensor], tf.Tensor]

#: Grappler rewrites that fold a chain of tf.add(x, 1.0) into one op: with them on,
#: "50 tf.adds" runs as one Add, and the comparison no longer compares ops.
NO_FOLDING = {"arithmetic_optimization": False, "constant_folding": False}


def graph_function(fn: UnaryOp, signature: list[tf.TensorSpec]) -> UnaryOp:
    """``tf.function(fn)`` with a fixed signature (typed: tf.function is not)."""
    return cast(UnaryOp, tf.function(fn, input_signature=signature))


def chain(op: UnaryOp, length: int, signature: list[tf.TensorSpec]) -> UnaryOp:
    """A tf.function applying ``op`` ``length`` times in sequence."""

    def applied(x: tf.Tensor) -> tf.Tensor:
        for _ in range(length):
            x = op(x)
        return x

    return graph_function(applied, signature)


def tf_add_one(x: tf.Tensor) -> tf.Tensor:
    return tf.add(x, 1.0)


def check(name: str, got: tf.Tensor, want: np.ndarray) -> None:
    """Fails the run when a contender computes the wrong thing."""
    if not np.array_equal(np.asarray(got), want):
        raise AssertionError(f"{name}: wrong result {np.asarray(got)[:4]}..., want {want[:4]}...")


def per_op(t: Timings, long: str, short: str, length: int) -> list[float]:
    """Seconds per application, per round: (chain of ``length`` - chain of 1) / (length - 1)."""
    return [(a - b) / (length - 1) for a, b in zip(t.per_call[long], t.per_call[short], strict=True)]


def bootstrap_spread(num: list[float], den: list[float], resamples: int = 1000) -> tuple[float, float]:
    """Quartiles of median(num) / median(den) over rounds drawn again with
    replacement: the spread of a ratio of medians of slopes, each slope a small
    difference of two large times, too noisy to divide round by round."""
    rng = np.random.default_rng(0)
    rounds = rng.integers(0, len(num), size=(resamples, len(num)))
    ratios = np.median(np.asarray(num)[rounds], axis=1) / np.median(np.asarray(den)[rounds], axis=1)
    return quartiles(sorted(ratios.tolist()))


def chain_comparison(contenders: dict[str, UnaryOp], x: tf.Tensor, rounds: int, prefix: str) -> tuple[Timings, Results]:
    """Times chains of CHAIN and of 1 application of each contender, interleaved.

    Returns the timings and, per contender, its median time per tf.function call
    (``{prefix}{name}_x{CHAIN}_us``, ``..._x1_us``) and its marginal time per
    application (``{prefix}{name}_per_op_us``).
    """
    signature = [tf.TensorSpec(x.shape, x.dtype)]
    want_chain = x.numpy() + CHAIN
    calls: dict[str, Callable[[], object]] = {}
    for name, op in contenders.items():
        long, short = chain(op, CHAIN, signature), chain(op, 1, signature)
        check(f"{name} x{CHAIN}", long(x), want_chain)
        check(f"{name} x1", short(x), x.numpy() + 1)
        calls[f"{name}_x{CHAIN}"] = functools.partial(long, x)
        calls[f"{name}_x1"] = functools.partial(short, x)
    t = interleave(calls, rounds=rounds, min_time=0.04)
    out: Results = {}
    for name in contenders:
        out[f"{prefix}{name}_x{CHAIN}_us"] = t.median(f"{name}_x{CHAIN}") * 1e6
        out[f"{prefix}{name}_x1_us"] = t.median(f"{name}_x1") * 1e6
        out[f"{prefix}{name}_per_op_us"] = statistics.median(per_op(t, f"{name}_x{CHAIN}", f"{name}_x1", CHAIN)) * 1e6
    return t, out


def overhead(lib: Path, rounds: int, *, fold: bool) -> Results:
    """Item 1: CHAIN TVMDSOOp add-ones against CHAIN tf.adds, on 1 float32.

    ``fold=False`` (the headline) turns off the Grappler rewrites that fold the
    tf.add chain into one op; ``fold=True`` keeps TensorFlow's defaults.
    The headline ``per_op_ratio_vs_tf_add`` is the cost of one application (the
    slope) with ``inplace={0: 0}``: tf.add writes over its input's buffer when
    nothing else uses it, and so does the op then. Without it each application
    allocates its output (``..._allocating``). The ratio of whole CHAIN-long
    tf.function calls (``chain_ratio``) is diluted by TF's cost of calling a
    tf.function from Python, the same for both.
    """
    if not fold:
        tf.config.optimizer.set_experimental_options(NO_FOLDING)
    module = tf_op.Module(lib)
    contenders = {"tvmdsoop": module.func("add_one"), "tf_add": tf_add_one}
    if not fold:
        contenders["tvmdsoop_inplace"] = module.func("add_one", inplace={0: 0})
    x = tf.constant([0.0], dtype=tf.float32)
    prefix = "overhead_grappler_default_" if fold else "overhead_"
    t, out = chain_comparison(contenders, x, rounds, prefix)
    key = f"{prefix}chain_ratio_vs_tf_add"
    out[key] = t.ratio(f"tvmdsoop_x{CHAIN}", f"tf_add_x{CHAIN}")
    out[f"{key}_q1"], out[f"{key}_q3"] = t.ratio_spread(f"tvmdsoop_x{CHAIN}", f"tf_add_x{CHAIN}")
    out[f"{prefix}ratio_x1"] = t.ratio("tvmdsoop_x1", "tf_add_x1")
    tf_add = per_op(t, f"tf_add_x{CHAIN}", "tf_add_x1", CHAIN)
    for name, key in (("tvmdsoop_inplace", "per_op_ratio_vs_tf_add"), ("tvmdsoop", "per_op_ratio_vs_tf_add_allocating")):
        if name in contenders:
            ops = per_op(t, f"{name}_x{CHAIN}", f"{name}_x1", CHAIN)
            out[key] = statistics.median(ops) / statistics.median(tf_add)
            out[f"{key}_q1"], out[f"{key}_q3"] = bootstrap_spread(ops, tf_add)
    out[f"{prefix}rounds"] = rounds
    return out


def py_function(lib: Path, rounds: int) -> Results:
    """Item 3: TVMDSOOp against tf.py_function calling the TVM function through
    DLPack, on PY_FUNCTION_SIZE floats, in chains of CHAIN (and 1) inside a
    tf.function."""
    add_one = tf_op.Module(lib).func("add_one")
    tvm_add_one = tvm_ffi.load_module(str(lib))["add_one"]

    def eager_tvm_add_one(x: tf.Tensor) -> tf.Tensor:
        # What a user writes without TVMDSOOp: the input goes to TVM through
        # DLPack, the output is allocated (aligned: TF needs 64 bytes) and handed
        # back to TF through DLPack, both without a copy.
        src = tvm_ffi.from_dlpack(tf.experimental.dlpack.to_dlpack(x))
        dst = aligned_empty(int(x.shape[0]))
        tvm_add_one(src, dst)
        return tf.experimental.dlpack.from_dlpack(dst.__dlpack__())

    def via_py_function(x: tf.Tensor) -> tf.Tensor:
        y = tf.py_function(eager_tvm_add_one, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    x = tf.constant(np.arange(PY_FUNCTION_SIZE, dtype=np.float32))
    t, out = chain_comparison({"tvmdsoop": add_one, "py_function": via_py_function}, x, rounds, "pyfunc_")
    # The key is per application: what one more call costs inside a graph. The
    # whole CHAIN-application tf.function also pays TF's fixed cost of calling a
    # tf.function from Python (~200 us here), the same for both, reported apart.
    out["pyfunc_speedup_per_op"] = float(out["pyfunc_py_function_per_op_us"]) / float(out["pyfunc_tvmdsoop_per_op_us"])
    out["speedup_vs_py_function"] = out["pyfunc_speedup_per_op"]
    out["speedup_vs_py_function_chain"] = t.ratio(f"py_function_x{CHAIN}", f"tvmdsoop_x{CHAIN}")
    out["speedup_vs_py_function_chain_q1"], out["speedup_vs_py_function_chain_q3"] = t.ratio_spread(
        f"py_function_x{CHAIN}", f"tvmdsoop_x{CHAIN}"
    )
    out["pyfunc_speedup_x1"] = t.ratio("py_function_x1", "tvmdsoop_x1")
    out["pyfunc_rounds"] = rounds
    return out


def large(lib: Path, rounds: int) -> Results:
    """Items 2 and 4: add-one on large tensors through TVMDSOOp (eager, and in a
    tf.function), the TVM function called directly through tvm_ffi (same input
    buffer, preallocated output), the old way (copies through numpy), and
    numpy's memcpy rate between preallocated arrays; in tf.functions also
    tf.add, and two applications in place (the second writes over the first's
    output), whose slope is an application that allocates nothing."""
    module = tf_op.Module(lib)
    add_one = module.func("add_one")
    tvm_add_one = tvm_ffi.load_module(str(lib))["add_one"]
    signature = [tf.TensorSpec([None], tf.float32)]
    graphs = {
        "tvmdsoop_graph": graph_function(add_one, signature),
        "tf_add_graph": graph_function(tf_add_one, signature),
        "inplace_graph_x2": chain(module.func("add_one", inplace={0: 0}), 2, signature),
    }

    out: Results = {"large_rounds": rounds}
    for label, n in LARGE_SIZES.items():
        # Fewer rounds at 64M: one round there takes about half a second.
        size_rounds = rounds if n < (1 << 26) else max(5, rounds * 2 // 3)
        out.update(large_size(label, n, add_one, graphs, tvm_add_one, size_rounds))
    for key in ("ratio_vs_direct_tvm", "graph_ratio_vs_direct_tvm", "old_way_ratio_vs_tvmdsoop"):
        headline = key if key.startswith("old_way") else f"large_{key}"
        for suffix in ("", "_q1", "_q3"):
            out[headline + suffix] = out[f"large_{LARGE_KEY_SIZE}_{key}{suffix}"]
    return out


def large_size(
    label: str,
    n: int,
    add_one: UnaryOp,
    graphs: dict[str, UnaryOp],
    tvm_add_one: Callable[..., object],
    rounds: int,
) -> Results:
    """The large-tensor contenders on ``n`` float32, figures keyed ``large_{label}_*``."""
    x = tf.random.uniform([n], dtype=tf.float32)
    want = x.numpy() + np.float32(1)
    x_tvm = tvm_ffi.from_dlpack(x)  # TF's buffer, seen by TVM, no copy
    # The direct call's output: a TF tensor allocated once, written in place
    # through DLPack, so both sides write memory of TF's allocator. A numpy
    # output is measured too: numpy asks the kernel for huge pages (madvise) on
    # arrays of 4 MiB and more, which TF's allocator does not.
    direct_out_tf = tf.zeros([n], dtype=tf.float32)
    direct_out = tvm_ffi.from_dlpack(direct_out_tf)
    numpy_out = aligned_empty(n)
    numpy_out.fill(0)  # fault the pages in before timing
    copy_src = np.ones(n, dtype=np.float32)
    copy_dst = np.zeros(n, dtype=np.float32)

    def direct() -> None:
        tvm_add_one(x_tvm, direct_out)

    def direct_numpy_out() -> None:
        tvm_add_one(x_tvm, numpy_out)

    def direct_fresh_out() -> None:
        # Into a fresh, untouched TF buffer, as the op's own output is: the
        # difference from direct() is the first touch of its pages.
        tvm_add_one(x_tvm, tvm_ffi.from_dlpack(tf.raw_ops.Empty(shape=[n], dtype=tf.float32, init=False)))

    def old_way() -> tf.Tensor:
        # tvm.contrib days: TF -> numpy copy -> TVM tensor -> call -> TF copy.
        src = tvm_ffi.from_dlpack(x.numpy())
        dst = np.empty(n, dtype=np.float32)
        tvm_add_one(src, dst)
        return tf.constant(dst)

    check(f"tvmdsoop eager {label}", add_one(x), want)
    for name, fn in graphs.items():
        check(f"{name} {label}", fn(x), want + (1 if name == "inplace_graph_x2" else 0))
    direct()
    check(f"direct {label}", direct_out_tf, want)
    direct_numpy_out()
    check(f"direct numpy out {label}", numpy_out, want)
    check(f"old way {label}", old_way(), want)
    del want
    contenders: dict[str, Callable[[], object]] = {
        "tvmdsoop": lambda: add_one(x),
        **{name: functools.partial(fn, x) for name, fn in graphs.items()},
        "direct_tvm": direct,
        "direct_tvm_numpy_out": direct_numpy_out,
        "direct_tvm_fresh_out": direct_fresh_out,
        "old_way": old_way,
        "memcpy": lambda: np.copyto(copy_dst, copy_src),
    }
    t = interleave(contenders, rounds=rounds, min_time=0.03, warmup=2)
    moved = 2 * 4 * n  # bytes read + written by add-one, and by the copy
    p = f"large_{label}_"
    out: Results = {f"{p}elements": n, f"{p}rounds": rounds}
    for key, name, base in [
        ("ratio_vs_direct_tvm", "tvmdsoop", "direct_tvm"),
        ("graph_ratio_vs_direct_tvm", "tvmdsoop_graph", "direct_tvm"),
        ("tf_add_graph_ratio_vs_direct_tvm", "tf_add_graph", "direct_tvm"),
        ("first_touch_ratio", "direct_tvm_fresh_out", "direct_tvm"),
        ("graph_ratio_vs_direct_tvm_fresh_out", "tvmdsoop_graph", "direct_tvm_fresh_out"),
        ("ratio_vs_direct_tvm_numpy_out", "tvmdsoop", "direct_tvm_numpy_out"),
        ("old_way_ratio_vs_tvmdsoop", "old_way", "tvmdsoop"),
    ]:
        out[p + key] = t.ratio(name, base)
        out[f"{p}{key}_q1"], out[f"{p}{key}_q3"] = t.ratio_spread(name, base)
    # The second in-place application (the slope of 2 over 1) writes over the
    # first's output: no allocation, no first touch.
    inplace = [(a - b) / d for a, b, d in zip(t.per_call["inplace_graph_x2"], t.per_call["tvmdsoop_graph"],
                                              t.per_call["direct_tvm"], strict=True)]
    out[f"{p}graph_inplace_ratio_vs_direct_tvm"] = statistics.median(inplace)
    out[f"{p}graph_inplace_ratio_vs_direct_tvm_q1"], out[f"{p}graph_inplace_ratio_vs_direct_tvm_q3"] = quartiles(inplace)
    for name in contenders:
        out[f"{p}{name}_ms"] = t.median(name) * 1e3
        if name == "inplace_graph_x2":  # two applications: its slope is above
            continue
        out[f"{p}{name}_gbps"] = moved / t.median(name) / 1e9
        if name != "memcpy":
            out[f"{p}{name}_fraction_of_memcpy"] = t.ratio("memcpy", name)
    return out


#: The largest difference allowed between TVM's float32 outputs and Keras's
#: (what tests/python/test_models.py allows).
MODEL_ATOL = 1e-5


#: The TVM runtime libraries VmDirect opens, by soname: once the op has run,
#: dlopen gives back the copies the op library opened (its TVMDSOOP_LIBRARY_PATH
#: search), so both sides run the same runtime.
TVM_FFI_SONAME, TVM_RUNTIME_SONAME = "libtvm_ffi.so", "libtvm_runtime.so"


class VmDirect:
    """A model's one-input function run by TVM's VM from a C loop
    (bench/vm_direct.c): no Python and no TensorFlow per call, the baseline of
    the whole-model comparison. Loaded once; each ``time`` call is one C loop."""

    def __init__(self, model_lib: Path, function: str, x: np.ndarray) -> None:
        if not VM_DIRECT.is_file():
            raise FileNotFoundError(f"{VM_DIRECT} is missing: run `make build`")
        lib = ctypes.CDLL(str(VM_DIRECT))
        lib.vm_direct_open.restype = ctypes.c_void_p
        floats, text = ctypes.POINTER(ctypes.c_float), ctypes.c_char_p
        shape_type = ctypes.POINTER(ctypes.c_int64)
        lib.vm_direct_open.argtypes = [text, text, text, text, floats, shape_type, ctypes.c_int, text, ctypes.c_int]
        lib.vm_direct_output.restype = ctypes.c_int64
        lib.vm_direct_output.argtypes = [ctypes.c_void_p, floats, ctypes.c_int64, text, ctypes.c_int]
        lib.vm_direct_time.restype = ctypes.c_double
        lib.vm_direct_time.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.vm_direct_close.restype = None
        lib.vm_direct_close.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self._err = ctypes.create_string_buffer(4096)
        x = np.ascontiguousarray(x, dtype=np.float32)
        shape = (ctypes.c_int64 * x.ndim)(*x.shape)
        paths = [TVM_FFI_SONAME.encode(), TVM_RUNTIME_SONAME.encode(), str(model_lib).encode(), function.encode()]
        self._handle: int | None = lib.vm_direct_open(
            *paths, x.ctypes.data_as(floats), shape, x.ndim, self._err, len(self._err)
        )
        if not self._handle:
            raise RuntimeError(f"vm_direct: {self._err.value.decode()}")

    def output(self, shape: tuple[int, ...]) -> np.ndarray:
        """One call's output, copied out."""
        out = np.empty(shape, dtype=np.float32)
        data = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        n = self._lib.vm_direct_output(self._handle, data, out.size, self._err, len(self._err))
        if n != out.size:
            raise RuntimeError(f"vm_direct: {self._err.value.decode() or f'{n} output elements, want {out.size}'}")
        return out

    def time(self, calls: int) -> float:
        """Seconds per call over ``calls`` calls, timed by the C loop."""
        seconds = float(self._lib.vm_direct_time(self._handle, calls, self._err, len(self._err)))
        if seconds < 0:
            raise RuntimeError(f"vm_direct: {self._err.value.decode()}")
        return seconds

    def close(self) -> None:
        if self._handle:
            self._lib.vm_direct_close(self._handle)
            self._handle = None


def sequenced(fn: UnaryOp, length: int, signature: list[tf.TensorSpec]) -> UnaryOp:
    """A tf.function calling ``fn`` ``length`` times on its input, each call after
    the one before, and returning the sum of the outputs (``tf.add_n``).

    The calls share the input and are ordered by control dependencies, so the
    slope between ``length`` and 1 holds the calls and nothing else (feeding each
    call from the last would add TF ops per call). The dependencies also keep
    Grappler from merging the calls as common subexpressions: TVMDSOOp is
    stateless, but nodes with different control inputs are never merged. The one
    ``add_n`` gives every output a data consumer: Grappler's dependency optimizer
    turns a stateless node whose output feeds only control dependencies into a
    NoOp (without the add_n, a chain of 20 op calls ran in the time of one)."""

    def applied(x: tf.Tensor) -> tf.Tensor:
        ys = [fn(x)]
        for _ in range(length - 1):
            with tf.control_dependencies([ys[-1]]):
                ys.append(fn(x))
        return tf.add_n(ys)

    return graph_function(applied, signature)


def check_close(name: str, got: tf.Tensor | np.ndarray, want: np.ndarray) -> float:
    """Fails the run when a model's output is off Keras's; returns the largest difference."""
    got = np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=MODEL_ATOL, err_msg=name)
    return float(np.max(np.abs(got - want)))


def model(models: Path, rounds: int) -> Results:
    """Item 7: the demo's Keras CNN (tests/modules/keras_cnn.py) compiled by TVM
    (TFLite, then the Relax VM) at each batch of MODEL_BATCHES, three ways in the
    same rounds: TVMDSOOp in a tf.function, TVM's VM from a C loop, and the Keras
    model itself in a tf.function. The headline keys take the larger figure of the
    batches."""
    import keras  # only this comparison needs it

    # The model the libraries were converted from (keras_cnn.py saved it), so the
    # weights are the compiled ones by construction.
    reference = keras.models.load_model(models / "cnn.keras")
    out: Results = {"model_rounds": rounds, "model_chain": MODEL_CHAIN}
    for batch in MODEL_BATCHES:
        out.update(model_batch(models, reference, batch, rounds))
    for key in ("ratio_vs_tvm_vm", "ratio_vs_keras"):
        worst = max(MODEL_BATCHES, key=lambda b: float(out[f"model_b{b}_{key}"]))
        out[f"model_{key}_batch"] = worst
        for suffix in ("", "_q1", "_q3"):
            out[f"model_{key}{suffix}"] = out[f"model_b{worst}_{key}{suffix}"]
    return out


def model_batch(models: Path, reference: Callable[..., tf.Tensor], batch: int, rounds: int) -> Results:
    """The whole-model contenders at one batch, figures keyed ``model_b{batch}_*``."""
    x_np = np.random.default_rng(batch).standard_normal((batch, 16, 16, 3)).astype(np.float32)
    x = tf.constant(x_np)
    signature = [tf.TensorSpec(x.shape, x.dtype)]
    want = reference(x, training=False).numpy()
    output_shape = [batch, int(want.shape[1])]
    op = tf_op.Module(models / f"cnn_b{batch}.so").func("main", output_shape=output_shape)

    def keras_call(t: tf.Tensor) -> tf.Tensor:
        return reference(t, training=False)

    p = f"model_b{batch}_"
    out: Results = {}
    calls: dict[str, Callable[[], object]] = {}
    for name, fn in (("tvmdsoop", op), ("keras", keras_call)):
        long, short = sequenced(fn, MODEL_CHAIN, signature), sequenced(fn, 1, signature)
        diff = check_close(f"{name} x1, batch {batch}", short(x), want)
        check_close(f"{name} x{MODEL_CHAIN}, batch {batch}", long(x).numpy() / MODEL_CHAIN, want)
        if name != "keras":
            out[f"{p}{name}_max_abs_diff"] = diff
        calls[f"{name}_x{MODEL_CHAIN}"] = functools.partial(long, x)
        calls[f"{name}_x1"] = functools.partial(short, x)
    # After the op has run: the op library has opened TVM's runtime, which this
    # process now shares with vm_direct.
    vm = VmDirect(models / f"cnn_b{batch}.so", "main", x_np)
    try:
        out[f"{p}tvm_vm_max_abs_diff"] = check_close(f"tvm_vm, batch {batch}", vm.output(tuple(output_shape)), want)
        calls["tvm_vm"] = SelfTimed(vm.time)
        t = interleave(calls, rounds=rounds, min_time=0.04)
    finally:
        vm.close()
    op_per_call = per_op(t, f"tvmdsoop_x{MODEL_CHAIN}", "tvmdsoop_x1", MODEL_CHAIN)
    keras_per_call = per_op(t, f"keras_x{MODEL_CHAIN}", "keras_x1", MODEL_CHAIN)
    vm_per_call = t.per_call["tvm_vm"]
    for key, num, den in (
        ("ratio_vs_tvm_vm", op_per_call, vm_per_call),
        ("ratio_vs_keras", op_per_call, keras_per_call),
    ):
        ratios = [a / b for a, b in zip(num, den, strict=True)]
        out[p + key] = statistics.median(ratios)
        out[f"{p}{key}_q1"], out[f"{p}{key}_q3"] = quartiles(ratios)
    if statistics.median(op_per_call) < 0.5 * statistics.median(vm_per_call):
        # Less than half a model call per op: the calls were merged or skipped.
        raise AssertionError(
            f"batch {batch}: {statistics.median(op_per_call) * 1e6:.1f} us per op call is "
            f"less than half of TVM's VM's {statistics.median(vm_per_call) * 1e6:.1f} us"
        )
    out[f"{p}tvmdsoop_per_call_us"] = statistics.median(op_per_call) * 1e6
    out[f"{p}keras_per_call_us"] = statistics.median(keras_per_call) * 1e6
    out[f"{p}tvm_vm_per_call_us"] = t.median("tvm_vm") * 1e6
    out[f"{p}overhead_us"] = float(out[f"{p}tvmdsoop_per_call_us"]) - float(out[f"{p}tvm_vm_per_call_us"])
    for name in ("tvmdsoop", "keras"):
        out[f"{p}{name}_x{MODEL_CHAIN}_us"] = t.median(f"{name}_x{MODEL_CHAIN}") * 1e6
        out[f"{p}{name}_x1_us"] = t.median(f"{name}_x1") * 1e6
    out[f"{p}ratio_vs_keras_x1"] = t.ratio("tvmdsoop_x1", "keras_x1")
    return out


def bridge_models() -> dict[str, tuple[Callable[..., tf.Tensor], UnaryOp, tuple[int, ...]]]:
    """What the bridge comparison compiles: by name, what tf_op.compile takes, how
    TF runs it (Keras models for inference), and its input shape after the batch."""
    import keras

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "modules"))
    from keras_cnn import INPUT_SHAPE, build_model

    keras.utils.set_random_seed(0)
    mlp = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    mobilenet = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), alpha=0.35,
                                               classifier_activation=None)
    rng = np.random.default_rng(0)
    w, b = tf.constant(rng.standard_normal((64, 64)).astype(np.float32)), tf.constant(rng.standard_normal(64).astype(np.float32))

    def math_ops(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(tf.nn.softplus(tf.tanh(x @ w + b) * 2.0 - x), axis=-1, keepdims=True)

    def inference(model: keras.Model) -> UnaryOp:
        return lambda x: model(x, training=False)

    cnn = build_model()
    return {"mlp": (mlp, inference(mlp), (256,)), "cnn": (cnn, inference(cnn), INPUT_SHAPE),
            "mobilenetv2": (mobilenet, inference(mobilenet), (96, 96, 3)), "tf_function": (math_ops, math_ops, (64,))}


def bridge(cache_dir: Path, rounds: int) -> Results:
    """tf_op.compile against TensorFlow running the same model: each model at each
    batch of MODEL_BATCHES, one model call per tf.function call on both sides,
    timed interleaved. A ratio is TF's time / the compiled op's (above 1: TVM is
    faster). The cache starts empty, so the compile time is a real compile."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    out: Results = {"bridge_rounds": rounds}
    for name, (fn, reference, shape) in bridge_models().items():
        signature = [tf.TensorSpec([None, *shape])]
        fast = tf_op.compile(fn, signature, cache_dir=cache_dir)
        for batch in MODEL_BATCHES:
            p = f"bridge_{name}_b{batch}_"
            x = tf.constant(np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32))
            started = time.perf_counter()
            fast.compile_for(((batch, *shape),))
            out[f"{p}compile_s"] = time.perf_counter() - started
            static = [tf.TensorSpec(x.shape)]
            native = graph_function(reference, static)
            compiled = graph_function(fast, static)
            want = native(x).numpy()
            out[f"{p}max_rel_diff"] = float(np.max(np.abs(compiled(x).numpy() - want)) / np.max(np.abs(want)))
            if out[f"{p}max_rel_diff"] > 1e-4:
                raise AssertionError(f"{name}, batch {batch}: the compiled op is off TF by {out[p + 'max_rel_diff']:.2g}")
            t = interleave({"tf": functools.partial(native, x), "tvm": functools.partial(compiled, x)},
                           rounds=rounds, min_time=0.04)
            out[f"bridge_ratio_vs_tf_{name}_b{batch}"] = t.ratio("tf", "tvm")
            out[f"bridge_ratio_vs_tf_{name}_b{batch}_q1"], out[f"bridge_ratio_vs_tf_{name}_b{batch}_q3"] = t.ratio_spread("tf", "tvm")
            out[f"{p}tf_us"], out[f"{p}tvm_us"] = t.median("tf") * 1e6, t.median("tvm") * 1e6
    return out


COMPARISONS: dict[str, Callable[[Path, int], Results]] = {
    "overhead": lambda lib, rounds: overhead(lib, rounds, fold=False),
    "overhead_grappler": lambda lib, rounds: overhead(lib, rounds, fold=True),
    "py_function": py_function,
    "large": large,
    "model": model,
    "bridge": bridge,
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", choices=sorted(COMPARISONS))
    parser.add_argument(
        "lib", type=Path, help="the add-one library (examples/build_add_one.py); for model, the models folder"
    )
    parser.add_argument("out", type=Path, help="where to write the JSON figures")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    results = COMPARISONS[args.comparison](args.lib, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
