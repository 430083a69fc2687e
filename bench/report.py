"""Writes bench/run.py's figures into docs/benchmarks.md's results part (between
common.RESULTS_MARKERS; the prose around it is hand-written) and its plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render straight to PNG

import matplotlib.pyplot as plt  # noqa: E402

from common import (BRIDGE_MODELS, CHAIN, GOALS, LARGE_KEY_SIZE, LARGE_SIZES, MODEL_BATCHES,  # noqa: E402
                    MODEL_CHAIN, PY_FUNCTION_SIZE, RESULTS_MARKERS, SERVED_CALLERS, SERVED_WORKLOADS, goal_met)

Results = Mapping[str, float | int | str]
Rows = list[tuple[str, str]]

#: The headline keys, which make bench must produce, with what each divides.
KEYS: Rows = [
    ("per_op_ratio_vs_tf_add", f"one application in a tf.function (slope of {CHAIN} over 1), TVMDSOOp "
     "`inplace={0: 0}` / `tf.add`, 1 float32"),
    ("large_ratio_vs_direct_tvm", f"TVMDSOOp eager / direct tvm_ffi call into a buffer made once, {LARGE_KEY_SIZE} float32"),
    ("large_graph_ratio_vs_direct_tvm", "the same, TVMDSOOp in a tf.function (a fresh output each call)"),
    ("speedup_vs_py_function", f"`tf.py_function` + DLPack / TVMDSOOp, per application on {PY_FUNCTION_SIZE} float32"),
    ("old_way_ratio_vs_tvmdsoop", f"copy through numpy / TVMDSOOp, {LARGE_KEY_SIZE} float32"),
    ("peak_rss_ratio_vs_tf_add", "extra peak RSS of TVMDSOOp / of `tf.add`, 256 MiB float32"),
    ("go_session_ratio_vs_tf_add", f"Go TF session: run of {CHAIN} TVMDSOOp add-ones / of {CHAIN} `AddV2`s, 1 float32"),
    ("go_dsoop_overhead_ns", "Go `dsoop.Func.Call` − the same call from a C loop, ns per call, 1 float32"),
    ("model_ratio_vs_tvm_vm", "Keras CNN compiled by TVM: TVMDSOOp per call in a tf.function / TVM's VM called "
     "from C, the worse batch"),
    ("model_ratio_vs_keras", "the same: TVMDSOOp per call / the Keras model per call, both in a tf.function"),
    ("bridge_ratio_vs_tf_cnn_b1", "`tf_op.compile` of the Keras CNN: TF's time / the compiled op's, batch 1"),
    ("bridge_ratio_vs_tf_mobilenetv2_b1", "the same for MobileNetV2 (alpha 0.35, 96x96), untuned TVM"),
    ("served_ratio_vs_direct_matmul_n8", "requests/s, 8 concurrent Go `Session.Run`s of a TVMDSOOp 512² matmul / "
     "8 goroutines calling it through `dsoop`"),
    ("served_ratio_vs_direct_model_b32_n8", "the same for the Keras CNN compiled by TVM (Relax VM), batch 32"),
    ("served_ratio_vs_tf_matmul_n8", "the matmul's requests/s: TVMDSOOp session / TF `MatMul` session, 8 callers"),
    ("rss_slope_bytes_per_call", "RSS growth per `Session.Run` of a TVMDSOOp add-one, slope over 100k runs, bytes"),
]
#: Reported with the headline keys when present: the tuned bridge (make bench TUNE=N) and the recorded GPU figures.
OPTIONAL_KEYS: Rows = [
    *((f"bridge_tuned_ratio_vs_tf_{m}_b{b}", f"`tf_op.compile(..., tune=N)` of {m}: TF's time / the tuned op's, "
       f"batch {b}") for m in BRIDGE_MODELS for b in MODEL_BATCHES),
    ("gpu_call_overhead_us", "GPU: host µs a call of our launch path − a raw launch of the same kernel"),
    ("gpu_bw_ratio_vs_d2d", "GPU: add-one's bandwidth through our path / a device-to-device copy's, 256 MiB"),
]
#: The details, by section: key and what it is.
DETAILS: dict[str, Rows] = {
    "Per-op cost (1 and 3)": [
        ("overhead_chain_ratio_vs_tf_add", f"whole {CHAIN}-application calls, TVMDSOOp / `tf.add` (both pay TF's "
         "fixed cost of calling a tf.function)"),
        ("overhead_grappler_default_chain_ratio_vs_tf_add", "the same with Grappler's defaults (tf.adds folded)"),
        ("per_op_ratio_vs_tf_add_allocating", "per application, TVMDSOOp allocating its output / `tf.add`"),
        ("speedup_vs_py_function_chain", f"whole {CHAIN}-application calls, `tf.py_function` / TVMDSOOp"),
        ("pyfunc_speedup_x1", "one application in its own tf.function, `tf.py_function` / TVMDSOOp"),
    ],
    "Go (6)": [
        ("go_session_tvmdsoop_us", f"µs a session run of {CHAIN} TVMDSOOp add-ones"),
        ("go_session_tf_add_us", f"µs a session run of {CHAIN} `AddV2`s"),
        ("go_dsoop_call_ns", "ns a `dsoop.Func.Call`"), ("go_dsoop_direct_c_ns", "ns the same call from a C loop"),
    ],
    "Memory (5, 10)": [
        ("memory_baseline_mib", "peak RSS, MiB: imports, warm-up, the 256 MiB input"),
        ("memory_tf_add_extra_mib", "over the baseline, MiB: + `tf.add(x, 1.0)`"),
        ("memory_tvmdsoop_extra_mib", "over the baseline, MiB: + TVMDSOOp add-one"),
        ("memory_output_mib", "one output, MiB"),
        ("rss_slope_tf_add_bytes_per_call", "RSS growth per `Session.Run` of `AddV2`, bytes"),
        ("model_rss_slope_bytes_per_call", "RSS growth per run of the TVM-compiled CNN, 20k runs, bytes"),
        ("model_rss_mib", "the CNN loaded (library, VM, first instance), MiB"),
        ("vm_instance_rss_kib", "each further VM instance of its pool, KiB"),
        ("vm_instances", "VM instances 8 concurrent callers made"),
        ("served_threads", "threads of the served benchmark's process at its end"),
    ],
}


def cell(r: Results, key: str) -> str:
    """A figure, digits by its size, with its quartiles over rounds when it has them."""
    if key not in r:
        return "–"
    v = r[key]
    if not isinstance(v, float):
        return str(v)
    text = f"{v:.{0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2}f}"
    q1, q3 = r.get(f"{key}_q1"), r.get(f"{key}_q3")
    return text + (f" [{q1:.2f}–{q3:.2f}]" if isinstance(q1, float) and isinstance(q3, float) else "")


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([f"| {' | '.join(header)} |", "|" + " --- |" * len(header),
                      *(f"| {' | '.join(row)} |" for row in rows)])


def goal(r: Results, key: str) -> list[str]:
    if key not in GOALS:
        return ["none (reported)", "–"]
    op, bound = GOALS[key]
    return [f"{'≤' if op == '<=' else '≥'} {bound:g}", "yes" if goal_met(key, float(r[key])) else "**no**"]


def headline(r: Results) -> list[tuple[str, str]]:
    """The headline keys, and the optional ones present."""
    return KEYS + [(key, what) for key, what in OPTIONAL_KEYS if key in r]


def results_part(r: Results) -> str:
    batches, sizes = MODEL_BATCHES, list(LARGE_SIZES)
    contenders = [("`tf.add`", "overhead_tf_add"), ("TVMDSOOp", "overhead_tvmdsoop"),
                  ("TVMDSOOp `inplace={0: 0}`", "overhead_tvmdsoop_inplace"),
                  ("`tf.add`, Grappler defaults", "overhead_grappler_default_tf_add"),
                  ("TVMDSOOp, Grappler defaults", "overhead_grappler_default_tvmdsoop"),
                  (f"TVMDSOOp, {PY_FUNCTION_SIZE} float32", "pyfunc_tvmdsoop"),
                  (f"`tf.py_function` + DLPack, {PY_FUNCTION_SIZE} float32", "pyfunc_py_function")]
    large = [("memcpy (numpy copyto)", "memcpy"), ("direct tvm_ffi, TF output", "direct_tvm"),
             ("direct tvm_ffi, numpy output", "direct_tvm_numpy_out"),
             ("direct tvm_ffi, fresh TF output", "direct_tvm_fresh_out"), ("TVMDSOOp eager", "tvmdsoop"),
             ("TVMDSOOp in tf.function", "tvmdsoop_graph"), ("`tf.add` in tf.function", "tf_add_graph"),
             ("old way (copies)", "old_way")]
    large_ratios = ["ratio_vs_direct_tvm", "graph_ratio_vs_direct_tvm", "tf_add_graph_ratio_vs_direct_tvm",
                    "first_touch_ratio", "graph_ratio_vs_direct_tvm_fresh_out", "graph_inplace_ratio_vs_direct_tvm",
                    "ratio_vs_direct_tvm_numpy_out", "old_way_ratio_vs_tvmdsoop"]
    tuned = any(key.startswith("bridge_tuned_") for key in r)
    parts = [
        f"Measured on {r['date']}: {r['cpu_count']} CPUs ({r['cpu_model']}), {r['platform']}; Python "
        f"{r['version_python']}, TensorFlow {r['version_tensorflow']}, apache-tvm {r['version_tvm']}, apache-tvm-ffi "
        f"{r['version_tvm_ffi']}, numpy {r['version_numpy']}; commit {r['git_commit']}; {r['overhead_rounds']} "
        f"rounds a comparison; `make bench` took {cell(r, 'bench_seconds')} s. Brackets: quartiles over rounds.",
        table(["key", "what it divides", "median [IQR]", "goal", "met"],
              [[f"`{k}`", what, f"**{cell(r, k)}**", *goal(r, k)] for k, what in headline(r)]),
        "![TVMDSOOp benchmarks](benchmarks.png)",
        "### Per-op cost (1 and 3)",
        table(["contender (1 float32 unless said)", f"µs per call, {CHAIN} applications", "µs per call, 1",
               "µs per application"], [[label, *(cell(r, p + s) for s in (f"_x{CHAIN}_us", "_x1_us", "_per_op_us"))]
                                       for label, p in contenders]),
        "### Large tensors (2 and 4)",
        table(["size", "contender", "ms per call", "GB/s", "of memcpy"],
              [[size, label, *(cell(r, f"large_{size}_{name}_{s}") for s in ("ms", "gbps", "fraction_of_memcpy"))]
               for size in sizes for label, name in large]),
        table(["ratio", *sizes], [[f"`{key}`", *(cell(r, f"large_{size}_{key}") for size in sizes)]
                                  for key in large_ratios]),
        "### Whole model (7)",
        table(["batch", "contender", "µs per call (slope)", f"µs per tf.function call, {MODEL_CHAIN} calls",
               "µs per tf.function call, 1 call"],
              [[str(b), name, *(cell(r, f"model_b{b}_{name}_{s}") for s in ("per_call_us", f"x{MODEL_CHAIN}_us",
                                                                            "x1_us"))]
               for b in batches for name in ("tvm_vm", "tvmdsoop", "keras")]),
        table(["figure", *(f"batch {b}" for b in batches)],
              [[f"`model_b*_{key}`", *(cell(r, f"model_b{b}_{key}") for b in batches)]
               for key in ("ratio_vs_tvm_vm", "ratio_vs_keras", "ratio_vs_keras_x1", "overhead_us")]),
        "### `tf_op.compile` against TensorFlow (8)",
        table(["model", "batch", "TF µs", "compiled op µs", "TF / compiled", "compile s",
               *([f"tuned op µs (tune={r.get('bridge_tune_trials')})", "TF / tuned", "tuning s"] if tuned else [])],
              [[m, str(b), *(cell(r, f"bridge_{m}_b{b}_{s}") for s in ("tf_us", "tvm_us")),
                cell(r, f"bridge_ratio_vs_tf_{m}_b{b}"), cell(r, f"bridge_{m}_b{b}_compile_s"),
                *([cell(r, f"bridge_{m}_b{b}_tuned_us"), cell(r, f"bridge_tuned_ratio_vs_tf_{m}_b{b}"),
                   cell(r, f"bridge_{m}_b{b}_tuned_compile_s")] if tuned else [])]
               for m in BRIDGE_MODELS for b in batches]),
        "### Served throughput (9), requests/s",
        table(["workload", "callers", "TVMDSOOp session", "direct (`dsoop`)", "TF session", "empty session",
               "session / direct", "session / TF"],
              [[w, str(n), *(cell(r, f"served_{w}_n{n}_{c}_rps") for c in ("session", "direct", "tf", "floor")),
                cell(r, f"served_ratio_vs_direct_{w}_n{n}"), cell(r, f"served_ratio_vs_tf_{w}_n{n}")]
               for w in SERVED_WORKLOADS for n in SERVED_CALLERS]),
    ]
    for title, rows in DETAILS.items():
        parts += [f"### {title}", table(["key", "what", "value"], [[f"`{k}`", what, cell(r, k)] for k, what in rows])]
    if "gpu_date" in r:
        parts.append(f"GPU figures (above): recorded on {r['gpu_date']} on {r['gpu_machine']}, driver "
                     f"{r['gpu_driver_version']}, by `make test-gpu` (docs/gpu.md), from bench/gpu_results.json; "
                     f"{r['gpu_stress_wrong']} values wrong of {r['gpu_stress_calls']} stress rounds.")
    return "\n\n".join(parts)


def write_plot(r: Results, path: Path) -> None:
    """Three panels: add-one per call and per application, GB/s per size, peak RSS."""
    fig, (ax_call, ax_bw, ax_mem) = plt.subplots(1, 3, figsize=(16, 4.8))
    names, prefixes = ["tf.add", "TVMDSOOp", "py_function\n+ DLPack"], ["overhead_tf_add", "overhead_tvmdsoop",
                                                                        "pyfunc_py_function"]
    for offset, suffix, label, alpha in [(-0.2, f"_x{CHAIN}_us", f"per tf.function call ({CHAIN} applications)", 1.0),
                                         (0.2, "_per_op_us", "per application (slope)", 0.55)]:
        bars = ax_call.bar([i + offset for i in range(3)], [max(float(r[p + suffix]), 1e-3) for p in prefixes], 0.4,
                           label=label, color=["#999999", "#1f77b4", "#d62728"], alpha=alpha)
        ax_call.bar_label(bars, fmt=lambda v: f"{v:.0f}" if v >= 10 else f"{v:.2f}", fontsize=8)
    ax_call.set(xticks=range(3), xticklabels=names, yscale="log", ylabel="µs (log)",
                title=f"add-one in a tf.function\n(1 float32; py_function: {PY_FUNCTION_SIZE})")
    series = [("memcpy (numpy)", "memcpy"), ("direct tvm_ffi", "direct_tvm"), ("TVMDSOOp eager", "tvmdsoop"),
              ("TVMDSOOp tf.function", "tvmdsoop_graph"), ("old way (copies)", "old_way")]
    width = 0.8 / len(series)
    for i, (label, name) in enumerate(series):
        ax_bw.bar([j + (i - (len(series) - 1) / 2) * width for j in range(len(LARGE_SIZES))],
                  [float(r[f"large_{size}_{name}_gbps"]) for size in LARGE_SIZES], width, label=label)
    ax_bw.set(xticks=range(len(LARGE_SIZES)), xticklabels=[f"{s} float32" for s in LARGE_SIZES],
              ylabel="GB/s (bytes read + written)", title="add-one on large tensors")
    bars = ax_mem.bar(["tf.add", "TVMDSOOp"], [float(r[f"memory_{m}_extra_mib"]) for m in ("tf_add", "tvmdsoop")],
                      color=["#999999", "#1f77b4"])
    ax_mem.bar_label(bars, fmt="%.0f MiB")
    ax_mem.axhline(float(r["memory_output_mib"]), color="black", linestyle="--", linewidth=1, label="one output")
    ax_mem.set(ylabel="peak RSS over the baseline (MiB)", title="add-one on 256 MiB float32")
    for ax in (ax_call, ax_bw, ax_mem):
        ax.legend(fontsize=8)
    fig.suptitle(f"TVMDSOOp benchmarks, {r['cpu_count']} CPUs ({r['cpu_model']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(r: Results, template: Path, path: Path, plot: Path) -> None:
    """``template`` (docs/benchmarks.md) with its results part made from ``r``, into ``path``; the plot."""
    text = template.read_text()
    start, end = (text.index(marker) for marker in RESULTS_MARKERS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text[:start]}{RESULTS_MARKERS[0]}\n\n{results_part(r)}\n\n{text[end:]}")
    write_plot(r, plot)
