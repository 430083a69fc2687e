"""Turns the figures of bench/run.py into docs/benchmarks.md and its plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render straight to PNG

import matplotlib.pyplot as plt  # noqa: E402

from common import (  # noqa: E402
    BRIDGE_MODELS,
    CHAIN,
    GOALS,
    LARGE_KEY_SIZE,
    LARGE_SIZES,
    MODEL_BATCHES,
    MODEL_CHAIN,
    PY_FUNCTION_SIZE,
    SERVED_CALLERS,
    SERVED_WORKLOADS,
    goal_met,
)

Results = Mapping[str, float | int | str]

#: The headline keys, in the order of the spec, with what each one divides.
KEYS: list[tuple[str, str]] = [
    (
        "per_op_ratio_vs_tf_add",
        f"one application in a tf.function (slope of {CHAIN} over 1), TVMDSOOp `inplace={{0: 0}}` / `tf.add`, 1 float32",
    ),
    ("large_ratio_vs_direct_tvm", f"TVMDSOOp eager / direct tvm_ffi call into a buffer made once, {LARGE_KEY_SIZE} float32"),
    ("large_graph_ratio_vs_direct_tvm", "the same, TVMDSOOp in a tf.function (a fresh output each call)"),
    ("speedup_vs_py_function", "`tf.py_function` + DLPack / TVMDSOOp, per application on 1K float32"),
    ("old_way_ratio_vs_tvmdsoop", f"copy through numpy / TVMDSOOp, {LARGE_KEY_SIZE} float32"),
    ("peak_rss_ratio_vs_tf_add", "extra peak RSS of TVMDSOOp / of `tf.add`, 256 MiB float32"),
    ("go_session_ratio_vs_tf_add", f"Go TF session: run of {CHAIN} TVMDSOOp add-ones / of {CHAIN} `AddV2`s, 1 float32"),
    ("go_dsoop_overhead_ns", "Go `dsoop.Func.Call` − the same call from a C loop, ns per call, 1 float32"),
    (
        "model_ratio_vs_tvm_vm",
        "Keras CNN compiled by TVM: TVMDSOOp per call in a tf.function / TVM's VM "
        f"called from C, the larger of batch {MODEL_BATCHES[0]} and {MODEL_BATCHES[-1]}",
    ),
    (
        "model_ratio_vs_keras",
        "the same: TVMDSOOp per call / the Keras model per call, both in a tf.function, "
        f"the larger of batch {MODEL_BATCHES[0]} and {MODEL_BATCHES[-1]}",
    ),
    ("bridge_ratio_vs_tf_cnn_b1", "`tf_op.compile` of the Keras CNN: TF's time / the compiled op's, batch 1, tf.function"),
    ("bridge_ratio_vs_tf_mobilenetv2_b1", "the same for MobileNetV2 (alpha 0.35, 96x96), batch 1, untuned TVM"),
    ("served_ratio_vs_direct_matmul_n8", "requests/s, 8 concurrent Go `Session.Run`s of a TVMDSOOp 512² matmul "
     "(TVM parallel schedule) / 8 goroutines calling it through `dsoop`"),
    ("served_ratio_vs_direct_model_b32_n8", "the same for the Keras CNN compiled by TVM (Relax VM), batch 32"),
    ("served_ratio_vs_tf_matmul_n8", "the matmul's requests/s: TVMDSOOp session / TF `MatMul` session, 8 callers"),
    ("rss_slope_bytes_per_call", "RSS growth per `Session.Run` of a TVMDSOOp add-one, slope over 100k runs, bytes"),
]


def _f(value: float | int | str, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _goal(r: Results, key: str) -> tuple[str, str]:
    """The goal's text and whether it is met ("–" when the key has no goal)."""
    if key not in GOALS:
        return "none (reported)", "–"
    op, bound = GOALS[key]
    sign = "≤" if op == "<=" else "≥"
    return f"{sign} {bound:g}", "yes" if goal_met(key, float(r[key])) else "**no**"


def _spread(r: Results, key: str) -> str:
    q1, q3 = r.get(f"{key}_q1"), r.get(f"{key}_q3")
    if isinstance(q1, float) and isinstance(q3, float):
        return f" [{q1:.2f}–{q3:.2f}]"
    return ""


def _times(r: Results, key: str) -> str:
    """``1.06× [1.03–1.08]``: a ratio with its quartiles."""
    return f"{_f(r[key])}×{_spread(r, key)}"


def _gpu_section(r: Results) -> list[str]:
    """The GPU figures, as recorded on a GPU machine by `make test-gpu`."""
    if "gpu_call_overhead_us" not in r:
        return ["## GPU", "", "No GPU figures recorded (bench/gpu_results.json; docs/gpu.md)."]
    rows = [
        ("gpu_call_overhead_us", f"{_f(r['gpu_call_overhead_us'])} µs",
         f"host time a call: our launch path {_f(r['gpu_call_us'])} µs − a raw launch of the same "
         f"kernel {_f(r['gpu_raw_launch_us'])} µs"),
        ("gpu_bw_ratio_vs_d2d", f"{_f(r['gpu_bw_ratio_vs_d2d'])}",
         f"add-one through our path {_f(r['gpu_add_one_gbps'], 0)} GB/s / device-to-device copy "
         f"{_f(r['gpu_d2d_copy_gbps'], 0)} GB/s, {int(r['gpu_bandwidth_bytes']) >> 20} MiB"),
    ]
    out = [
        "## GPU",
        "",
        f"Recorded on {r['gpu_date']} on {r['gpu_machine']}, driver {r['gpu_driver_version']} "
        f"(CUDA {r['gpu_cuda_driver_api']}), by `make test-gpu` (`tests/gpu/stream_harness.c`, "
        "docs/gpu.md); this page's other figures are for the CPU machine. Copied from "
        "`bench/gpu_results.json`, which a GPU run rewrites.",
        "",
        "| key | value | goal | met | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, value, what in rows:
        goal, met = _goal(r, key)
        out.append(f"| `{key}` | {value} | {goal} | {met} | {what} |")
    out += [
        "",
        f"Ordering under stress in the same run: {r['gpu_stress_calls']} rounds of a slow kernel then "
        f"TVM's add_one on one non-blocking stream, {r['gpu_stress_wrong']} values wrong.",
    ]
    return out


def write_plot(r: Results, path: Path) -> None:
    """Three panels: time per tf.function call, throughput per size, peak RSS."""
    fig, (ax_call, ax_bw, ax_mem) = plt.subplots(1, 3, figsize=(16, 4.8))

    names = ["tf.add", "TVMDSOOp", "py_function\n+ DLPack"]
    prefixes = ["overhead_tf_add", "overhead_tvmdsoop", "pyfunc_py_function"]
    for offset, suffix, label, alpha in [
        (-0.2, f"_x{CHAIN}_us", f"per tf.function call ({CHAIN} applications)", 1.0),
        (0.2, "_per_op_us", "per application (slope)", 0.55),
    ]:
        ys = [max(float(r[p + suffix]), 1e-3) for p in prefixes]
        bars = ax_call.bar(
            [i + offset for i in range(len(names))],
            ys,
            0.4,
            label=label,
            color=["#999999", "#1f77b4", "#d62728"],
            alpha=alpha,
        )
        ax_call.bar_label(bars, fmt=lambda v: f"{v:.0f}" if v >= 10 else f"{v:.2f}", fontsize=8)
    ax_call.set_xticks(range(len(names)), names)
    ax_call.set_yscale("log")
    ax_call.set_ylabel("µs (log)")
    ax_call.set_title(f"add-one in a tf.function\n(1 float32; py_function: {PY_FUNCTION_SIZE})")
    ax_call.legend(fontsize=8, loc="upper left")

    series = [
        ("memcpy (numpy)", "memcpy", "#999999"),
        ("direct tvm_ffi", "direct_tvm", "#2ca02c"),
        ("TVMDSOOp eager", "tvmdsoop", "#1f77b4"),
        ("TVMDSOOp tf.function", "tvmdsoop_graph", "#17becf"),
        ("old way (copies)", "old_way", "#d62728"),
    ]
    labels = list(LARGE_SIZES)
    width = 0.8 / len(series)
    for i, (label, name, color) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ys = [float(r[f"large_{size}_{name}_gbps"]) for size in labels]
        ax_bw.bar(xs, ys, width, label=label, color=color)
    ax_bw.set_xticks(range(len(labels)), [f"{s} float32" for s in labels])
    ax_bw.set_ylabel("GB/s (bytes read + written)")
    ax_bw.set_title("add-one on large tensors")
    ax_bw.legend(fontsize=8)

    mem_names = ["tf.add", "TVMDSOOp"]
    mem_values = [float(r["memory_tf_add_extra_mib"]), float(r["memory_tvmdsoop_extra_mib"])]
    bars = ax_mem.bar(mem_names, mem_values, color=["#999999", "#1f77b4"])
    ax_mem.bar_label(bars, fmt="%.0f MiB")
    ax_mem.axhline(float(r["memory_output_mib"]), color="black", linestyle="--", linewidth=1, label="one output")
    ax_mem.set_ylabel("peak RSS over the baseline (MiB)")
    ax_mem.set_title("add-one on 256 MiB float32")
    ax_mem.legend(fontsize=8)

    fig.suptitle(f"TVMDSOOp benchmarks, {r['cpu_count']} CPUs ({r['cpu_model']})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _results_table(r: Results) -> list[str]:
    lines = ["| key | what it divides | median [IQR over rounds] | goal | met |", "| --- | --- | --- | --- | --- |"]
    for key, what in KEYS:
        goal, met = _goal(r, key)
        lines.append(f"| `{key}` | {what} | **{_f(r[key])}**{_spread(r, key)} | {goal} | {met} |")
    return lines


def _overhead_table(r: Results) -> list[str]:
    lines = [
        f"| contender | per call, {CHAIN} applications (µs) | per call, 1 application (µs) | per application (µs) |",
        "| --- | --- | --- | --- |",
    ]
    rows = [
        ("`tf.add(x, 1.0)`, 1 float32", "overhead_tf_add"),
        ("TVMDSOOp, 1 float32", "overhead_tvmdsoop"),
        ("TVMDSOOp `inplace={0: 0}`, 1 float32", "overhead_tvmdsoop_inplace"),
        ("`tf.add`, 1 float32, Grappler defaults", "overhead_grappler_default_tf_add"),
        ("TVMDSOOp, 1 float32, Grappler defaults", "overhead_grappler_default_tvmdsoop"),
        (f"TVMDSOOp, {PY_FUNCTION_SIZE} float32", "pyfunc_tvmdsoop"),
        (f"`tf.py_function` + DLPack, {PY_FUNCTION_SIZE} float32", "pyfunc_py_function"),
    ]
    for label, p in rows:
        lines.append(
            f"| {label} | {_f(r[f'{p}_x{CHAIN}_us'], 1)} | {_f(r[f'{p}_x1_us'], 1)} | {_f(r[f'{p}_per_op_us'], 2)} |"
        )
    return lines


def _large_table(r: Results) -> list[str]:
    lines = [
        "| size | contender | ms per call | GB/s | of memcpy | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size in LARGE_SIZES:
        p = f"large_{size}_"
        rows = [
            ("memcpy (numpy copyto)", "memcpy", ""),
            ("direct tvm_ffi, TF output", "direct_tvm", ""),
            ("direct tvm_ffi, numpy output", "direct_tvm_numpy_out", ""),
            ("direct tvm_ffi, fresh TF output", "direct_tvm_fresh_out", f"{_f(r[p + 'first_touch_ratio'])}× direct"),
            ("TVMDSOOp eager", "tvmdsoop", f"{_f(r[p + 'ratio_vs_direct_tvm'])}× direct"),
            ("TVMDSOOp in tf.function", "tvmdsoop_graph", f"{_f(r[p + 'graph_ratio_vs_direct_tvm'])}× direct"),
            ("`tf.add` in tf.function", "tf_add_graph", f"{_f(r[p + 'tf_add_graph_ratio_vs_direct_tvm'])}× direct"),
            ("old way (copies)", "old_way", f"{_f(r[p + 'old_way_ratio_vs_tvmdsoop'])}× TVMDSOOp"),
        ]
        for label, name, ratio in rows:
            share = "" if name == "memcpy" else f"{float(r[f'{p}{name}_fraction_of_memcpy']) * 100:.0f}%"
            ms, gbps = _f(r[f"{p}{name}_ms"], 3), _f(r[f"{p}{name}_gbps"], 1)
            lines.append(f"| {size} | {label} | {ms} | {gbps} | {share} | {ratio} |")
    return lines


def _memory_table(r: Results) -> list[str]:
    return [
        "| process | peak RSS (MiB) | over the baseline (MiB) |",
        "| --- | --- | --- |",
        f"| baseline (imports, warm-up, 256 MiB input) | {_f(r['memory_baseline_mib'], 0)} | – |",
        f"| + `tf.add(x, 1.0)` | {_f(r['memory_tf_add_mib'], 0)} | {_f(r['memory_tf_add_extra_mib'], 1)} |",
        f"| + TVMDSOOp add-one | {_f(r['memory_tvmdsoop_mib'], 0)} | {_f(r['memory_tvmdsoop_extra_mib'], 1)} |",
    ]


def _model_table(r: Results) -> list[str]:
    lines = [
        f"| batch | contender | µs per call (slope) | µs per tf.function call, {MODEL_CHAIN} calls "
        "| µs per tf.function call, 1 call | ratio [IQR] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for b in MODEL_BATCHES:
        p = f"model_b{b}_"
        rows = [
            ("TVM's VM from a C loop", "tvm_vm", "–", "–", ""),
            (
                "TVMDSOOp",
                "tvmdsoop",
                _f(r[f"{p}tvmdsoop_x{MODEL_CHAIN}_us"], 0),
                _f(r[f"{p}tvmdsoop_x1_us"], 0),
                f"{_times(r, p + 'ratio_vs_tvm_vm')} the VM; {_times(r, p + 'ratio_vs_keras')} Keras",
            ),
            ("Keras (`model(x)`)", "keras", _f(r[f"{p}keras_x{MODEL_CHAIN}_us"], 0), _f(r[f"{p}keras_x1_us"], 0), ""),
        ]
        for label, name, chain_us, one_us, ratio in rows:
            lines.append(f"| {b} | {label} | {_f(r[f'{p}{name}_per_call_us'], 1)} | {chain_us} | {one_us} | {ratio} |")
    return lines


def _served_table(r: Results) -> list[str]:
    lines = ["| workload | callers | TVMDSOOp session | direct (`dsoop`) | TF session | empty session "
             "| session / direct [IQR] | session / TF [IQR] |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in SERVED_WORKLOADS:
        for n in SERVED_CALLERS:
            p = f"served_{w}_n{n}_"
            rps = " | ".join(_f(r[f"{p}{c}_rps"], 0) for c in ("session", "direct", "tf", "floor"))
            lines.append(f"| {w} | {n} | {rps} | {_times(r, f'served_ratio_vs_direct_{w}_n{n}')} "
                         f"| {_times(r, f'served_ratio_vs_tf_{w}_n{n}')} |")
    return lines


def _bridge_table(r: Results) -> list[str]:
    lines = ["| model | batch | TF µs per call | compiled op µs per call | TF / compiled [IQR] | compile s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in BRIDGE_MODELS:
        for b in MODEL_BATCHES:
            p = f"bridge_{name}_b{b}_"
            lines.append(f"| {name} | {b} | {_f(r[p + 'tf_us'], 0)} | {_f(r[p + 'tvm_us'], 0)} "
                         f"| {_times(r, f'bridge_ratio_vs_tf_{name}_b{b}')} | {_f(r[p + 'compile_s'], 1)} |")
    return lines


def write_markdown(r: Results, path: Path, plot: Path, profile_notes: Path) -> None:
    """docs/benchmarks.md: how to run, what is compared, the results, the profile."""
    profile = profile_notes.read_text().strip() if profile_notes.is_file() else "_bench/profile.md is missing._"
    key_size = LARGE_KEY_SIZE
    old = [float(r[f"large_{size}_old_way_ratio_vs_tvmdsoop"]) for size in LARGE_SIZES]
    old_low, old_high = min(old), max(old)
    model_overhead = "; ".join(f"{_f(r[f'model_b{b}_overhead_us'], 1)} µs at batch {b}" for b in MODEL_BATCHES)
    model_x1 = ", ".join(f"{_f(r[f'model_b{b}_ratio_vs_keras_x1'])}× Keras's at batch {b}" for b in MODEL_BATCHES)
    text = f"""# Benchmarks

<!-- Written by `make bench` (bench/run.py, bench/report.py): edit those, not this file.
     The Profile section comes from bench/profile.md. -->

Measured on {r["date"]}: {r["cpu_count"]} CPUs ({r["cpu_model"]}), Python {r["version_python"]},
TensorFlow {r["version_tensorflow"]}, apache-tvm {r["version_tvm"]}, apache-tvm-ffi {r["version_tvm_ffi"]},
numpy {r["version_numpy"]}; commit {r["git_commit"]}. Every figure is for the CPU.

## How to run

```sh
make bench                      # builds the op library first; {_f(r.get("bench_seconds", 0.0), 0)} s on this machine
make bench-publish              # the last results into docs/benchmarks.md and benchmarks.png
.venv/bin/python bench/run.py --quick   # fewer rounds, for trying changes out
```

It compiles the add-one function once with TVM in its own process
(the demo's `examples/build_add_one.py`, into `build/bench/add_one.so`: TVM's compiler and its LLVM
never enter a TensorFlow process), runs each comparison in one fresh process
(`bench/compare.py`), measures memory in fresh processes (`bench/memory.py`), and
writes `build/bench/results.json` (flat: every key below, the per-size details, the
machine and the versions) and this page and its plot into `build/bench/`, changing
no tracked file; `make bench-publish` writes them here.

How figures are taken (`bench/timing.py`): each contender is warmed up, then called
enough times per timing to last 30–40 ms; the contenders of a comparison are timed
in turns, round after round (A B, B A, A B, …; {r["overhead_rounds"]} rounds, fewer for 64M),
with `time.perf_counter` and the garbage collector off. A ratio is the **median over
rounds of the ratio of two timings taken in the same round**: this machine is
shared and noisy, and only ratios measured together count. The brackets give the
quartiles of those per-round ratios. Times and GB/s are medians over rounds.

## What is compared

1. **Per-op cost** (`per_op_ratio_vs_tf_add`): a `tf.function` applying add-one
   {CHAIN} times in sequence to a 1-element float32 tensor: TVMDSOOp
   (`tf_op.Module(lib).func("add_one", inplace={{0: 0}})`) against `tf.add(x, 1.0)`,
   per application: the slope between the {CHAIN}- and the 1-application function,
   a ratio of median slopes (brackets: its quartiles over rounds drawn again with
   replacement). `tf.add` writes over its input's buffer when nothing else uses it;
   with `inplace` the op does too, so the headline compares like with like; without
   it (each application allocating its output) the ratio is in the details, and so is
   the ratio of whole {CHAIN}-application calls, diluted by TF's cost of calling a
   `tf.function` from Python, the same for both. Grappler's
   arithmetic optimisation and constant folding are turned off in this process:
   with them, TensorFlow folds the {CHAIN} `tf.add`s into one `AddV2` (checked on the
   optimised graph), which it cannot do for a custom op, and the comparison would
   no longer compare ops. The figure with TensorFlow's defaults is in the details.
2. **Large tensors** (`large_ratio_vs_direct_tvm`, at {key_size}): add-one on 1M, 16M and 64M
   float32 through TVMDSOOp (eager, and in a `tf.function`:
   `large_graph_ratio_vs_direct_tvm`, with `tf.add` in one beside it) against the
   same TVM function called directly through `tvm_ffi` on the same input buffer with a preallocated output. The direct call's output is
   a TF tensor allocated once and written in place through DLPack, so both sides
   write memory from TF's allocator; with a numpy output (also reported) the direct
   call is a little faster at 16M, because numpy asks for transparent huge pages on
   large arrays and TF's allocator does not. GB/s counts bytes read plus written
   (8 per element), against numpy's `copyto` between two preallocated arrays in
   the same rounds, this machine's practical limit. The function is TVM's plain
   serial loop (one core); the L3 of this machine is large, so 1M and 16M are
   partly cache-resident.
3. **What a user would write without TVMDSOOp** (`speedup_vs_py_function`):
   `tf.py_function` calling the TVM function, the input passed through
   `tf.experimental.dlpack.to_dlpack` / `tvm_ffi.from_dlpack`, the output a
   64-byte-aligned numpy array handed back with `tf.experimental.dlpack.from_dlpack`
   (both without a copy; TensorFlow aborts the process on a misaligned import, so a
   plain `np.empty` does not do), on {PY_FUNCTION_SIZE}-element float32 tensors, in the same
   {CHAIN}-application `tf.function` as 1. The key is the ratio of the
   per-application costs (the slope, as below): what each call costs in a graph.
   The whole {CHAIN}-application `tf.function` also pays TensorFlow's fixed cost of
   calling a `tf.function` from Python, the same for both; its ratio
   (`speedup_vs_py_function_chain`) is {_f(r["speedup_vs_py_function_chain"])}.
4. **The old way** (`old_way_ratio_vs_tvmdsoop`, at {key_size}): what `tvm.contrib` users did
   before the op: `x.numpy()` (a copy), a `tvm_ffi` tensor over that array, the
   call into a fresh numpy output, and `tf.constant` of the result (a copy back),
   for the large sizes, timed in the same rounds as 2. No goal: it is reported.
5. **Memory** (`peak_rss_ratio_vs_tf_add`): peak RSS (`ru_maxrss`) of a fresh process
   applying add-one once to a 256 MiB float32 tensor, TVMDSOOp against `tf.add`,
   each minus that of a baseline process that does the same imports and warm-up and
   creates the input only; {r["memory_repeats"]} processes of each kind, interleaved, medians.
   One output is {_f(r["memory_output_mib"], 0)} MiB; a copy of the input or of the output would
   show as another {_f(r["memory_output_mib"], 0)}.
6. **Go** (`go test -bench`, interleaved rounds inside each benchmark):
   `go_session_ratio_vs_tf_add` runs a Go TF session (graft) on a graph of {CHAIN}
   chained TVMDSOOp add-ones against one of {CHAIN} `AddV2`s
   (`tfbridge.BenchmarkSessionChain`: {_f(r["go_session_tvmdsoop_us"], 1)} µs against
   {_f(r["go_session_tf_add_us"], 1)} µs a run). Each Go call adds two constant nodes
   (the library path, the output sizes); sharing them across calls was measured side
   by side and changed nothing, so they are not the gap.
   `go_dsoop_overhead_ns` is what the Go binding adds to a call: `dsoop.Func.Call`
   ({_f(r["go_dsoop_call_ns"], 0)} ns) against the same function called from a C loop
   ({_f(r["go_dsoop_direct_c_ns"], 1)} ns) (`dsoop.BenchmarkCallOverhead`): one cgo
   transition, a pooled argument frame, and cgo's check of the pointers it passes.
   The TF kernels do not pay it.
7. **A whole model** (`model_ratio_vs_tvm_vm`, `model_ratio_vs_keras`): the demo's Keras CNN
   (`tests/modules/keras_cnn.py`: two convolutions, pooling, a dense layer; input
   [B,16,16,3], output [B,10]) converted to TFLite and compiled by TVM into a Relax VM
   library (`tests/modules/build_models.py`, into `build/bench/models/`), at batch
   {" and ".join(str(b) for b in MODEL_BATCHES)}, three ways in the same rounds: TVMDSOOp
   (`tf_op.Module("cnn_b{{B}}.so").func("main", output_shape=[B, 10])`) in a `tf.function`;
   TVM's VM called from a C loop with no Python per call (`bench/vm_direct.c`, loaded
   with ctypes into the same process: the op's own VM path in `dsoop/vm.c`, one VM
   instance, the input wrapped once, each returned tensor released at once, timed with
   `clock_gettime`); and the Keras model it was converted from (`cnn.keras`) in a
   `tf.function`. The `tf.function`s call the model {MODEL_CHAIN} times (and once) on one
   input, each call ordered after the one before by a control dependency, and return
   the sum of the outputs (one `add_n`, which keeps Grappler from pruning calls whose
   output feeds only a control dependency); a call's cost is the slope
   (time of {MODEL_CHAIN} − time of 1) / {MODEL_CHAIN - 1}, per round, so TensorFlow's fixed cost of
   calling a `tf.function` drops out. A key is the median over rounds of the per-round
   ratio of those costs; the headline is the larger of the batch sizes' (here
   batch {r["model_ratio_vs_tvm_vm_batch"]} for the first, batch {r["model_ratio_vs_keras_batch"]} for the second), so
   the goal holds at both. Every contender's output is checked against Keras's first
   (within 1e-5). TVM's kernels here are serial (`tvm.compile`'s default CPU pipeline
   does not parallelise them), while TensorFlow runs Keras's convolutions on its
   intra-op threads: the Keras ratio moves with how many CPUs are free.
8. **`tf_op.compile` against TensorFlow** (`bridge_ratio_vs_tf_*`): each model of
   `bench/compare.py`'s `bridge_models` (a Keras MLP 256-512-10, the CNN of 7,
   MobileNetV2 with `weights=None, input_shape=(96, 96, 3), alpha=0.35`, and a
   `tf.function` of math ops on [B, 64]) compiled with `tf_op.compile` at batch
   {" and ".join(str(b) for b in MODEL_BATCHES)} into an emptied cache (the compile
   time is a real compile, TVM in its child process), then one call per
   `tf.function` call on both sides, in the same rounds: TF running the model
   (Keras with `training=False`) against the compiled op. A ratio is TF's time / the
   op's: above 1, the compiled model is faster. Outputs are checked against TF's
   first (relative error at most 1e-4).
9. **Served throughput** (`served_ratio_vs_*`, `tfbridge.BenchmarkServed`): N = 1, 2
   and 8 goroutines each serving requests back to back for 0.2 s, four contenders in
   rotating order per round, 5 rounds: concurrent `Session.Run`s of a Go TF session
   (default options) running TVMDSOOp; the same TVM code called directly from Go
   (`dsoop.Func.Call` into a buffer per caller, `dsoop.VMFunc.Call` for the model);
   TF's own equivalent in a session (`MatMul`; the Keras CNN's SavedModel loaded
   with `tf.LoadSavedModel`); and an empty session (an `Identity`: what any `Run`
   costs). Workloads: a 512² float32 matmul compiled by TVM with a parallel
   schedule for this CPU (`tests/modules/build_modules.py`), the weight a constant
   of the graphs, and the Keras CNN of 7 at batch 1 and 32. Results are checked
   against TF's first. A key is the median of per-round ratios of requests/s. TVM's
   thread pool is as TVM sizes it by default (docs/serving.md).
10. **RSS over many runs** (`rss_slope_bytes_per_call`, `tfbridge.BenchmarkRSS`).

## Results

{chr(10).join(_results_table(r))}

![TVMDSOOp benchmarks](benchmarks.png)

### Per-op cost (1 and 3)

{chr(10).join(_overhead_table(r))}

Per application = (time of the {CHAIN}-application `tf.function` − time of the
1-application one) / {CHAIN - 1}, per round, median; the per-application ratios below divide
those medians. With TensorFlow's default Grappler the
{CHAIN}-application ratio is {_f(r["overhead_grappler_default_chain_ratio_vs_tf_add"])} (the `tf.add` chain runs as one op),
with Grappler's folding off {_times(r, "overhead_chain_ratio_vs_tf_add")}. Per application, TVMDSOOp
costs {_times(r, "per_op_ratio_vs_tf_add")} a `tf.add` on one element in place, {_times(r, "per_op_ratio_vs_tf_add_allocating")}
allocating its output; a
`tf.py_function` costs {_f(r["pyfunc_speedup_per_op"], 0)}× a TVMDSOOp on {PY_FUNCTION_SIZE} elements; a single
application in its own `tf.function` is {_f(r["pyfunc_speedup_x1"])}× faster through TVMDSOOp, the
`tf.function` call itself (about {_f(r["overhead_tf_add_x1_us"], 0)} µs here) dominating both.

### Large tensors (2 and 4)

{chr(10).join(_large_table(r))}

At 1M the fixed cost of a call (the Python wrapper and TF's dispatch, tens to
hundreds of µs on this machine) is still comparable to the 0.3 ms of work. At 16M an
eager TVMDSOOp call takes {_times(r, "large_16M_ratio_vs_direct_tvm")} the direct call's time, at 64M
{_times(r, "large_64M_ratio_vs_direct_tvm")}; against a direct call writing a numpy output,
{_times(r, "large_16M_ratio_vs_direct_tvm_numpy_out")} at 16M. In a `tf.function` the op takes
{_times(r, "large_16M_graph_ratio_vs_direct_tvm")} the direct call's time at 16M (`tf.add`:
{_times(r, "large_16M_tf_add_graph_ratio_vs_direct_tvm")}): both write a fresh 64 MiB output on every call. The
direct call into a fresh TF buffer takes {_times(r, "large_16M_first_touch_ratio")} its time into the buffer made
once (the first touch of the pages: TF's allocator does not ask for huge pages), and the op
{_times(r, "large_16M_graph_ratio_vs_direct_tvm_fresh_out")} the former. An application that
writes over its input (`inplace={{0: 0}}`, the second of two) takes {_times(r, "large_16M_graph_inplace_ratio_vs_direct_tvm")}
the direct call. The old way moves every byte three
times instead of once (a copy out, the call, a copy back, into freshly allocated
memory) and takes {old_low:.1f}–{old_high:.1f}× the op's time.

### Whole model (7)

{chr(10).join(_model_table(r))}

What the op adds to a model call, against the VM from C: {model_overhead} (a
difference of medians, negative when it is below the rounds' noise). Run once in its
own `tf.function`, the whole call takes {model_x1}: there TensorFlow's fixed cost
of calling a `tf.function` weighs on both.

At batch 1 the goal is not met. A `perf` profile of the batch-1 chain put the op's
own share at about 5 µs a call, beside the ~39 µs of TVM's kernels and ~4 µs of
TVM's VM that both contenders pay: TF's executor 1.8 µs, the kernel 1.0, malloc
and free 0.9 (four allocations: the input's wrapper and TVM Tensor, the output's
DLPack view and TF buffer), other libc 0.7, the op's code and tvm_ffi 0.6; and TF's
idle pool threads spin about 4.5 µs a call on the other CPU, which a 2-CPU machine
feels. Fewer allocations in `CallReturning` (kernels/tvm_dso_op.cc) is the next step.

### `tf_op.compile` against TensorFlow (8)

{chr(10).join(_bridge_table(r))}

Untuned TVM (`tvm.compile`'s default CPU pipeline, the portable `x86-64` target)
against TensorFlow's own kernels: it wins on the small CNN and on elementwise math
at batch 1 and loses on dense layers and MobileNetV2, badly at batch 32, where
TensorFlow's oneDNN kernels use every core and vector extension. See docs/bridge.md
for when not to use it.

### Served throughput (9)

Requests per second (medians over rounds):

{chr(10).join(_served_table(r))}

The process had {_f(r["served_threads"], 0)} threads at the end.

### Memory (5, 10)

{chr(10).join(_memory_table(r))}

Over many runs (`tfbridge.BenchmarkRSS`, RSS after a GC, least-squares slope):
a TVMDSOOp add-one on 1024 float32 {_f(r["rss_slope_bytes_per_call"], 1)} bytes per `Session.Run`
over 100k runs, `AddV2` {_f(r["rss_slope_tf_add_bytes_per_call"], 1)}; the TVM-compiled CNN
{_f(r["model_rss_slope_bytes_per_call"], 1)} bytes per run over 20k runs. The CNN takes
{_f(r["model_rss_mib"], 1)} MiB loaded (library, VM, first instance), and each further VM
instance of its pool {_f(r["vm_instance_rss_kib"], 0)} KiB ({_f(r["vm_instances"], 0)} made
by 8 concurrent callers, bounded by `TVMDSOOP_VM_INSTANCES`, default the CPU count).

{chr(10).join(_gpu_section(r))}

## Profile

{profile}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    write_plot(r, plot)
