"""One comparison in this process, its figures written as flat JSON (docs/benchmarks.md
says what each measures), or one memory figure.

    python bench/compare.py {overhead,py_function,large,model,bridge,peers} --out OUT.json
    python bench/compare.py peers --out OUT.json --models cnn,lstm --rounds 3 [--tune TRIALS]
    python bench/compare.py memory {baseline,tvmdsoop,tf_add}

One process each, so that no comparison inherits another's allocator or cache state.
TVM's compiler never enters it (tf_op.compile runs TVM in child processes).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import cast

from common import (BRIDGE_CACHE, CHAIN, DEFOP_SIZE, DEFOPS, LARGE_KEY_SIZE, LARGE_SIZES, LIBRARY, MEMORY_SIZE, LARGE_RATIOS, MODEL_BATCHES,
                    MODEL_CHAIN, MODELS_DIR, PER_OP_CHAIN, PER_OP_PERCENTILE, PER_OP_SINGLE_CALLS, PY_FUNCTION_SIZE,
                    ROOT, TVM_BESIDE_TF, VM_DIRECT, Results)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's import: no start-up logging

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tvm_ffi  # noqa: E402

import tf_op  # noqa: E402
from timing import SelfTimed, Timings, interleave, quartiles  # noqa: E402

UnaryOp = Callable[[tf.Tensor], tf.Tensor]
Contenders = dict[str, Callable[[], object]]

#: Grappler rewrites that fold a chain of tf.add(x, 1.0) into one op: with them on,
#: "50 tf.adds" runs as one Add, and the comparison no longer compares ops.
NO_FOLDING = {"arithmetic_optimization": False, "constant_folding": False}


def graph_function(fn: UnaryOp, signature: list[tf.TensorSpec]) -> UnaryOp:
    return cast(UnaryOp, tf.function(fn, input_signature=signature))


def chain(op: UnaryOp, length: int, signature: list[tf.TensorSpec]) -> UnaryOp:
    """A tf.function applying ``op`` ``length`` times in sequence."""
    return graph_function(lambda x: functools.reduce(lambda y, _: op(y), range(length), x), signature)


def sequenced(fn: UnaryOp, length: int, signature: list[tf.TensorSpec]) -> UnaryOp:
    """A tf.function calling ``fn`` ``length`` times on its input, each after the one before,
    returning the sum: no TF op per call but the call, none merged (different control
    inputs), none pruned (Grappler makes a node whose output feeds only control inputs a NoOp)."""

    def applied(x: tf.Tensor) -> tf.Tensor:
        ys = [fn(x)]
        for _ in range(length - 1):
            with tf.control_dependencies([ys[-1]]):
                ys.append(fn(x))
        return tf.add_n(ys)

    return graph_function(applied, signature)


tf_add_one: UnaryOp = functools.partial(tf.add, y=1.0)


def aligned_empty(n: int, alignment: int = 64) -> np.ndarray:
    """An empty float32 vector, aligned: TF accepts a less aligned one through DLPack, then aborts."""
    raw = np.empty(n + alignment // 4, dtype=np.float32)
    offset = (-raw.ctypes.data % alignment) // 4
    return raw[offset : offset + n]


def check(name: str, got: tf.Tensor | np.ndarray, want: np.ndarray, tol: float = 0.0) -> None:  # fails the run
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol, err_msg=name)


def put(out: Results, key: str, values: list[float]) -> None:
    """``key``: the median of per-round ``values``; ``key_q1``, ``key_q3``: their quartiles."""
    out[key] = statistics.median(values)
    out[f"{key}_q1"], out[f"{key}_q3"] = quartiles(values)


def alias(out: Results, key: str, source: str) -> None:  # a headline key: source's figure and quartiles
    out.update({key + suffix: out[source + suffix] for suffix in ("", "_q1", "_q3")})


def per_op(t: Timings, name: str, length: int) -> list[float]:
    """Seconds per application, per round: (``name`` x``length`` - ``name`` x1) / (length - 1)."""
    return [(a - b) / (length - 1) for a, b in zip(t.per_call[f"{name}_x{length}"], t.per_call[f"{name}_x1"], strict=True)]


def built(fns: dict[str, UnaryOp], x: tf.Tensor, length: int, build: Callable[..., UnaryOp] = chain,
          check_output: Callable[[str, int, tf.Tensor], None] | None = None) -> Contenders:
    """Each of ``fns`` built ``length`` times and once, checked: calls on ``x`` named ``{name}_x{n}``."""
    calls: Contenders = {}
    for name, fn in fns.items():
        for n in (length, 1):
            graph = build(fn, n, [tf.TensorSpec(x.shape, x.dtype)])
            (check_output or (lambda what, n, y: check(what, y, x.numpy() + n)))(f"{name} x{n}", n, graph(x))
            calls[f"{name}_x{n}"] = functools.partial(graph, x)
    return calls


def slope_comparison(calls: Contenders, names: Iterable[str], rounds: int, prefix: str, length: int = CHAIN,
                     per: str = "per_op") -> tuple[Timings, Results]:
    """``calls`` (``built``'s of ``names``, and others) timed: µs per call, per application of each of ``names``."""
    t = interleave(calls, rounds=rounds, min_time=0.04)
    out: Results = {}
    for name in names:
        for n in (length, 1):
            out[f"{prefix}{name}_x{n}_us"] = t.median(f"{name}_x{n}") * 1e6
        out[f"{prefix}{name}_{per}_us"] = statistics.median(per_op(t, name, length)) * 1e6
    return t, out


def overhead(rounds: int) -> Results:
    """1: TVMDSOOp add-ones against tf.adds on 1 float32, Grappler's folding off."""
    tf.config.optimizer.set_experimental_options(NO_FOLDING)
    module, x = tf_op.Module(LIBRARY), tf.constant([0.0])
    fns = {"tvmdsoop": module.func("add_one"), "tf_add": tf_add_one,
           "tvmdsoop_inplace": module.func("add_one", inplace={0: 0})}
    t, out = slope_comparison(built(fns, x, CHAIN), fns, rounds, "overhead_")
    put(out, "overhead_chain_ratio_vs_tf_add", t.ratios(f"tvmdsoop_x{CHAIN}", f"tf_add_x{CHAIN}"))
    # The headline: slopes of longer chains, of a low percentile of single calls (common.PER_OP_CHAIN).
    s, q = interleave(built(fns, x, PER_OP_CHAIN), rounds=rounds, single=PER_OP_SINGLE_CALLS), PER_OP_PERCENTILE
    slope = {n: (s.percentile(f"{n}_x{PER_OP_CHAIN}", q) - s.percentile(f"{n}_x1", q)) / (PER_OP_CHAIN - 1) for n in fns}
    out.update({f"overhead_{name}_p{q}_per_op_us": seconds * 1e6 for name, seconds in slope.items()})
    for name, key in (("tvmdsoop_inplace", "per_op_ratio_vs_tf_add"), ("tvmdsoop", "per_op_ratio_vs_tf_add_allocating")):
        out[key] = slope[name] / slope["tf_add"] if min(slope[name], slope["tf_add"]) > 0 else float("nan")  # <= 0: noise
    return {**out, **eager_calls(x, rounds), "overhead_rounds": rounds}


def eager_calls(x: tf.Tensor, rounds: int) -> Results:
    """One eager call, outside any graph: ``x + 1`` compiled by ``tf_op.compile``
    (through the op library's eager entry), its ``Func`` alone, and TF's own
    eager ``tf.add`` (its op dispatch), on 1 float32."""
    compiled = tf_op.compile(lambda t: t + 1.0, [tf.TensorSpec(x.shape, x.dtype)], cache_dir=BRIDGE_CACHE)
    func = compiled.compile_for((tuple(x.shape),)).func
    one = tf.constant(1.0)
    calls: Contenders = {"eager_tf_add": lambda: tf.add(x, one), "eager_compiled": lambda: compiled(x),
                         "eager_func": lambda: func(x)}
    for name, call in calls.items():
        got = call()
        check(name, got[0] if isinstance(got, tuple) else got, x.numpy() + 1)  # the Func: a tuple of its outputs
    t = interleave(calls, rounds=rounds, min_time=0.04)
    out: Results = {f"overhead_{name}_us": t.median(name) * 1e6 for name in calls}
    put(out, "eager_ratio_vs_tf_add", t.ratios("eager_compiled", "eager_tf_add"))
    return out


def py_function(rounds: int) -> Results:
    """3: TVMDSOOp against tf.py_function calling the TVM function through DLPack."""
    tvm_add_one = tvm_ffi.load_module(str(LIBRARY))["add_one"]

    def eager_tvm_add_one(x: tf.Tensor) -> tf.Tensor:
        # What a user writes without TVMDSOOp: both ways through DLPack, no copy.
        dst = aligned_empty(int(x.shape[0]))
        tvm_add_one(tvm_ffi.from_dlpack(tf.experimental.dlpack.to_dlpack(x)), dst)
        return tf.experimental.dlpack.from_dlpack(dst.__dlpack__())

    def via_py_function(x: tf.Tensor) -> tf.Tensor:
        y = tf.py_function(eager_tvm_add_one, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    fns = {"tvmdsoop": tf_op.Module(LIBRARY).func("add_one"), "py_function": via_py_function}
    x = tf.constant(np.arange(PY_FUNCTION_SIZE, dtype=np.float32))
    t, out = slope_comparison(built(fns, x, CHAIN), fns, rounds, "pyfunc_")
    out["pyfunc_speedup_per_op"] = float(out["pyfunc_py_function_per_op_us"]) / float(out["pyfunc_tvmdsoop_per_op_us"])
    out["speedup_vs_py_function"] = out["pyfunc_speedup_per_op"]
    put(out, "speedup_vs_py_function_chain", t.ratios(f"py_function_x{CHAIN}", f"tvmdsoop_x{CHAIN}"))
    return out


def large(rounds: int) -> Results:
    """2 and 4: add-one on large tensors (fewer rounds at 64M: half a second each)."""
    module, signature = tf_op.Module(LIBRARY), [tf.TensorSpec([None], tf.float32)]
    add_one, tvm_add_one = module.func("add_one"), tvm_ffi.load_module(str(LIBRARY))["add_one"]
    graphs = {"tvmdsoop_graph": graph_function(add_one, signature), "tf_add_graph": graph_function(tf_add_one, signature),
              "inplace_graph_x2": chain(module.func("add_one", inplace={0: 0}), 2, signature)}
    out: Results = {"large_rounds": rounds}
    for label, n in LARGE_SIZES.items():
        x = tf.random.uniform([n], dtype=tf.float32)
        want = x.numpy() + np.float32(1)
        x_tvm = tvm_ffi.from_dlpack(x)  # TF's buffer, seen by TVM, no copy
        # The direct call writes a TF tensor made once, so both sides write TF's memory.
        direct_out_tf = tf.zeros([n], dtype=tf.float32)
        direct_out = tvm_ffi.from_dlpack(direct_out_tf)
        copy_src, copy_dst = np.ones(n, dtype=np.float32), np.zeros(n, dtype=np.float32)

        def old_way(x: tf.Tensor = x, n: int = n) -> tf.Tensor:
            # tvm.contrib days: TF -> numpy copy -> TVM tensor -> call -> TF copy.
            dst = np.empty(n, dtype=np.float32)
            tvm_add_one(tvm_ffi.from_dlpack(x.numpy()), dst)
            return tf.constant(dst)

        contenders: Contenders = {
            "tvmdsoop": functools.partial(add_one, x), **{name: functools.partial(fn, x) for name, fn in graphs.items()},
            "direct_tvm": functools.partial(tvm_add_one, x_tvm, direct_out),
            # Into a fresh, untouched TF buffer, as the op's own output is: the first touch of its pages.
            "direct_tvm_fresh_out": lambda x_tvm=x_tvm, n=n: tvm_add_one(
                x_tvm, tvm_ffi.from_dlpack(tf.raw_ops.Empty(shape=[n], dtype=tf.float32, init=False))),
            "old_way": old_way, "memcpy": functools.partial(np.copyto, copy_dst, copy_src)}
        for name, fn in contenders.items():  # the fresh output and memcpy compute nothing to check
            got = fn()  # the direct call returns nothing: it writes direct_out_tf
            if name not in ("memcpy", "direct_tvm_fresh_out"):
                check(f"{name} {label}", direct_out_tf if name == "direct_tvm" else got, want + (name == "inplace_graph_x2"))
        del want
        t = interleave(contenders, rounds=rounds if n < 1 << 26 else max(5, rounds * 2 // 3), min_time=0.03, warmup=2)
        p = f"large_{label}_"
        for key, num, den in LARGE_RATIOS:
            put(out, p + key, t.ratios(num, den))
        # The second in-place application writes over the first's output: no allocation, no first touch.
        put(out, f"{p}graph_inplace_ratio_vs_direct_tvm", [(a - b) / d for a, b, d in zip(
            t.per_call["inplace_graph_x2"], t.per_call["tvmdsoop_graph"], t.per_call["direct_tvm"], strict=True)])
        for name in contenders:
            out[f"{p}{name}_ms"] = t.median(name) * 1e3
            if name != "inplace_graph_x2":  # two applications: its slope is above
                out[f"{p}{name}_gbps"] = 2 * 4 * n / t.median(name) / 1e9  # bytes read + written
                out[f"{p}{name}_fraction_of_memcpy"] = t.ratio("memcpy", name)
    for key in ("ratio_vs_direct_tvm", "graph_ratio_vs_direct_tvm", "old_way_ratio_vs_tvmdsoop"):
        alias(out, key if key.startswith("old_way") else f"large_{key}", f"large_{LARGE_KEY_SIZE}_{key}")
    return out


class VmDirect:
    """A model's one-input function run by TVM's VM from a C loop (bench/vm_direct.c).
    Open it after the op has run: dlopen then gives back the op library's TVM runtime."""

    def __init__(self, model_lib: str, function: str, x: np.ndarray) -> None:
        lib = ctypes.CDLL(str(VM_DIRECT))
        floats, text, size = ctypes.POINTER(ctypes.c_float), ctypes.c_char_p, ctypes.c_int64
        lib.vm_direct_open.restype = ctypes.c_void_p
        lib.vm_direct_open.argtypes = [text, text, floats, ctypes.POINTER(size), ctypes.c_int, text, ctypes.c_int]
        lib.vm_direct_time.restype = ctypes.c_double
        lib.vm_direct_time.argtypes = [ctypes.c_void_p, ctypes.c_int, floats, size, text, ctypes.c_int]
        lib.vm_direct_close.argtypes = [ctypes.c_void_p]
        self._lib, self._err = lib, ctypes.create_string_buffer(4096)
        x = np.ascontiguousarray(x, dtype=np.float32)
        self._handle = lib.vm_direct_open(model_lib.encode(), function.encode(), x.ctypes.data_as(floats),
                                          (size * x.ndim)(*x.shape), x.ndim, self._err, len(self._err))
        if not self._handle:
            raise RuntimeError(f"vm_direct: {self._err.value.decode()}")

    def time(self, calls: int, out: np.ndarray | None = None) -> float:
        """Seconds per call over ``calls`` calls, timed by the C loop; the last output into ``out``."""
        data = None if out is None else out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        seconds = float(self._lib.vm_direct_time(self._handle, calls, data, 0 if out is None else out.size,
                                                 self._err, len(self._err)))
        if seconds < 0:
            raise RuntimeError(f"vm_direct: {self._err.value.decode()}")
        return seconds

    def close(self) -> None:
        self._lib.vm_direct_close(self._handle)


def model(rounds: int) -> Results:
    """7: the Keras CNN compiled by TVM, through TVMDSOOp, TVM's VM from C, and Keras."""
    import keras  # only this comparison needs it

    reference = keras.models.load_model(MODELS_DIR / "cnn.keras")
    out: Results = {"model_rounds": rounds, "model_chain": MODEL_CHAIN}
    for batch in MODEL_BATCHES:
        x_np = np.random.default_rng(batch).standard_normal((batch, 16, 16, 3)).astype(np.float32)
        x, p, library = tf.constant(x_np), f"model_b{batch}_", str(MODELS_DIR / f"cnn_b{batch}.so")
        want = reference(x, training=False).numpy()
        fns = {"tvmdsoop": tf_op.Module(library).func("main", output_shape=list(want.shape)),
               "keras": lambda t: reference(t, training=False)}
        fns["tvmdsoop"](x)  # the op library opens TVM's runtime before VmDirect does
        vm, vm_out = VmDirect(library, "main", x_np), np.empty_like(want)
        try:
            vm.time(1, vm_out)
            check(f"tvm_vm, batch {batch}", vm_out, want, 1e-5)
            calls = built(fns, x, MODEL_CHAIN, sequenced, lambda name, n, y: check(name, y.numpy() / n, want, 1e-5))
            t, figures = slope_comparison({**calls, "tvm_vm": SelfTimed(vm.time)}, fns, rounds, p, MODEL_CHAIN, "per_call")
        finally:
            vm.close()
        out.update(figures)
        out[f"{p}tvm_vm_per_call_us"] = t.median("tvm_vm") * 1e6
        op_calls = per_op(t, "tvmdsoop", MODEL_CHAIN)
        for key, den in (("ratio_vs_tvm_vm", t.per_call["tvm_vm"]), ("ratio_vs_keras", per_op(t, "keras", MODEL_CHAIN))):
            put(out, p + key, [a / b for a, b in zip(op_calls, den, strict=True)])
        out[f"{p}overhead_us"] = float(out[f"{p}tvmdsoop_per_call_us"]) - float(out[f"{p}tvm_vm_per_call_us"])
        if float(out[f"{p}overhead_us"]) < -0.5 * float(out[f"{p}tvm_vm_per_call_us"]):
            raise AssertionError(f"batch {batch}: less than half a model call per op call: the calls were merged")
    for key in ("ratio_vs_tvm_vm", "ratio_vs_keras"):  # the headline: the worse batch
        out[f"model_{key}_batch"] = worst = max(MODEL_BATCHES, key=lambda b: float(out[f"model_b{b}_{key}"]))
        alias(out, f"model_{key}", f"model_b{worst}_{key}")
    return out


def bridge(rounds: int, tune: int = 0) -> Results:
    """8: tf_op.compile (and, ``tune``, tuned) against TF; the cache starts empty: real compiles."""
    import keras

    os.environ.update({k: os.environ.get(k, v) for k, v in TVM_BESIDE_TF.items()})  # before TVM's first thread
    sys.path.insert(0, str(ROOT / "tests" / "modules"))
    from keras_cnn import INPUT_SHAPE, build_model

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    w, b = (tf.constant(rng.standard_normal(s).astype(np.float32)) for s in ((64, 64), (64,)))

    def math_ops(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_mean(tf.nn.softplus(tf.tanh(x @ w + b) * 2.0 - x), axis=-1, keepdims=True)

    models = {"mlp": (keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"),
                                        keras.layers.Dense(10)]), (256,)), "cnn": (build_model(), INPUT_SHAPE),
              "mobilenetv2": (keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), alpha=0.35,
                                                             classifier_activation=None), (96, 96, 3)),
              "tf_function": (math_ops, (64,))}
    shutil.rmtree(BRIDGE_CACHE, ignore_errors=True)
    out: Results = {"bridge_rounds": rounds, "bridge_tune_trials": tune, **{f"bridge_{k.lower()}": os.environ[k] for k in TVM_BESIDE_TF}}
    for name, (fn, shape) in models.items():
        reference = (lambda x, m=fn: m(x, training=False)) if isinstance(fn, keras.Model) else fn
        signature = [tf.TensorSpec([None, *shape])]
        variants = {"tvm": tf_op.compile(fn, signature, cache_dir=BRIDGE_CACHE)}
        if tune:
            variants["tuned"] = tf_op.compile(fn, signature, cache_dir=BRIDGE_CACHE, tune=tune)
        for batch in MODEL_BATCHES:
            p = f"bridge_{name}_b{batch}_"
            x = tf.constant(np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32))
            native = graph_function(reference, [tf.TensorSpec(x.shape)])
            want = native(x).numpy()
            calls: dict[str, Callable[[], object]] = {"tf": functools.partial(native, x)}
            for variant, fast in variants.items():
                tag = "tuned_" if variant == "tuned" else ""
                started = time.perf_counter()
                fast.compile_for(((batch, *shape),))
                out[f"{p}{tag}compile_s"] = time.perf_counter() - started
                compiled = graph_function(fast, [tf.TensorSpec(x.shape)])
                # Relative to the output's scale: MobileNetV2's random-init logits are tiny.
                check(f"{name}, batch {batch}, {variant}", compiled(x).numpy() / np.abs(want).max(),
                      want / np.abs(want).max(), 1e-4)
                calls[variant] = functools.partial(compiled, x)
            t = interleave(calls, rounds=rounds, min_time=0.04)
            out[f"{p}tf_us"] = t.median("tf") * 1e6
            for variant in variants:
                put(out, f"bridge_{'tuned_' * (variant == 'tuned')}ratio_vs_tf_{name}_b{batch}", t.ratios("tf", variant))
                out[f"{p}{variant}_us"] = t.median(variant) * 1e6
    return out


def peers(rounds: int, tune: int = 0, models: str = "") -> Results:
    """11: other engines on other models (bench/peers.py, imported by this comparison alone: its converters are heavy)."""
    from peers import peers as run_peers

    return run_peers(rounds, tune, [m for m in models.split(",") if m])


def defop(rounds: int) -> Results:
    """A defop (tests/modules/defops.py's bias_swish, one pass over the data)
    against the same expression in TF's own ops (add, sigmoid, mul: three
    passes) and XLA's fusion of them, each in a tf.function, interleaved."""
    ops = tf_op.load_ops(DEFOPS)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((DEFOP_SIZE, DEFOP_SIZE)).astype(np.float32))
    out: Results = {"defop_rounds": rounds}
    for label, b in (("", x[::-1]), ("bias_", tf.constant(rng.standard_normal(DEFOP_SIZE).astype(np.float32)))):
        contenders: Contenders = {
            "defop": functools.partial(tf.function(ops.bias_swish), x, b),
            "tf": functools.partial(tf.function(lambda x, b: (x + b) * tf.sigmoid(x + b)), x, b),
            "xla": functools.partial(tf.function(lambda x, b: (x + b) * tf.sigmoid(x + b), jit_compile=True), x, b),
        }
        want = contenders["tf"]().numpy()
        for name, fn in contenders.items():
            check(f"defop {label}{name}", fn(), want, tol=1e-5)
        t = interleave(contenders, rounds=rounds, min_time=0.05, warmup=2)
        put(out, f"defop_fused_{label}ratio", t.ratios("tf", "defop"))
        put(out, f"defop_fused_{label}ratio_vs_xla", t.ratios("xla", "defop"))
        out.update({f"defop_fused_{label}{name}_ms": t.median(name) * 1e3 for name in contenders})
    return out


COMPARISONS: dict[str, Callable[..., Results]] = {"overhead": overhead, "py_function": py_function, "large": large,
                                                  "model": model, "defop": defop, "bridge": bridge, "peers": peers}


def memory(mode: str) -> None:
    """5: peak RSS after one add-one on MEMORY_SIZE float32, everything loaded in every mode."""
    add_one = tf_op.Module(LIBRARY).func("add_one")
    small = tf.constant([0.0])
    check("add-one on 1 element", [add_one(small), tf_add_one(small)], np.ones((2, 1)))
    x = tf.fill([MEMORY_SIZE], 1.0)
    if mode != "baseline":
        check(mode, {"tvmdsoop": add_one, "tf_add": tf_add_one}[mode](x)[-1:], np.array([2.0]))
    print(json.dumps({"mode": mode, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=[*COMPARISONS, "memory"])
    parser.add_argument("mode", nargs="?", choices=("baseline", "tvmdsoop", "tf_add"), help="memory: what it applies")
    parser.add_argument("--out", help="where a comparison writes its figures (JSON)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--tune", type=int, default=0, help="bridge, peers: also the models tuned with TRIALS trials")
    parser.add_argument("--models", default="", help="peers: which models, comma-separated (default all)")
    args = parser.parse_args(argv)
    if args.what == "memory":
        return memory(args.mode or parser.error("memory needs a mode"))
    extra = {"bridge": {"tune": args.tune}, "peers": {"tune": args.tune, "models": args.models}}.get(args.what, {})
    results = COMPARISONS[args.what](args.rounds, **extra)
    with open(args.out or parser.error(f"{args.what} needs --out"), "w") as f:
        f.write(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
