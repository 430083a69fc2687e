"""Writes bench/run.py's figures into docs/benchmarks.md's results part (between
common.RESULTS_MARKERS; the prose around it is hand-written) and its plot."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render straight to PNG

import matplotlib.pyplot as plt  # noqa: E402

from common import (BRIDGE_MODELS, CHAIN, DEFOP_SIZE, GOALS, LARGE_KEY_SIZE, LARGE_RATIOS, LARGE_SIZES, MODEL_BATCHES,  # noqa: E402
                    MODEL_CHAIN, PEERS_ENGINES, PEERS_MODELS, PEERS_PLOT, PEERS_RIVALS, PEERS_TOLERANCE, PER_OP_CHAIN,
                    PER_OP_PERCENTILE, PY_FUNCTION_SIZE, RESULTS_MARKERS, SERVED_CALLERS, SERVED_WORKLOADS,
                    TVM_BESIDE_TF, Results, goal_met)

Rows = list[tuple[str, str]]

#: The headline keys, which make bench must produce, with what each divides.
KEYS: Rows = [
    ("per_op_ratio_vs_tf_add", f"one application in a tf.function (slope of {PER_OP_CHAIN} over 1, p{PER_OP_PERCENTILE} of "
     "single calls), TVMDSOOp `inplace={0: 0}` / `tf.add`"),
    ("eager_ratio_vs_tf_add", "one eager call, 1 float32: `x + 1` compiled by `tf_op.compile` (the eager entry) / "
     "`tf.add` (TF's op dispatch)"),
    ("large_ratio_vs_direct_tvm", f"TVMDSOOp eager / direct tvm_ffi call into a buffer made once, {LARGE_KEY_SIZE} float32"),
    ("large_graph_ratio_vs_direct_tvm", "the same, TVMDSOOp in a tf.function (a fresh output each call)"),
    ("speedup_vs_py_function", f"`tf.py_function` + DLPack / TVMDSOOp, per application on {PY_FUNCTION_SIZE} float32"),
    ("old_way_ratio_vs_tvmdsoop", f"copy through numpy / TVMDSOOp, {LARGE_KEY_SIZE} float32"),
    ("peak_rss_ratio_vs_tf_add", "extra peak RSS of TVMDSOOp / of `tf.add`, 256 MiB float32"),
    ("go_session_ratio_vs_tf_add", f"Go TF session: run of {CHAIN} TVMDSOOp add-ones / of {CHAIN} `AddV2`s, 1 float32"),
    ("go_dsoop_overhead_ns", "Go `dsoop.Func.Call` − the same call from a C loop, ns per call, 1 float32"),
    ("model_ratio_vs_tvm_vm", "Keras CNN compiled by TVM: TVMDSOOp per call in a tf.function / TVM's VM from C, worse batch"),
    ("model_ratio_vs_keras", "the same: TVMDSOOp per call / the Keras model per call, both in a tf.function"),
    ("bridge_ratio_vs_tf_cnn_b1", "`tf_op.compile` of the Keras CNN: TF's time / the compiled op's, batch 1"),
    ("bridge_ratio_vs_tf_mobilenetv2_b1", "the same for MobileNetV2 (alpha 0.35, 96x96), untuned TVM"),
    ("served_ratio_vs_direct_matmul_n8", "requests/s, 8 concurrent Go `Session.Run`s of a TVMDSOOp 512² matmul / "
     "8 goroutines calling it through `dsoop`"),
    ("served_ratio_vs_direct_model_b32_n8", "the same for the Keras CNN compiled by TVM (Relax VM), batch 32"),
    ("served_ratio_vs_tf_matmul_n8", "the matmul's requests/s: TVMDSOOp session / TF `MatMul` session, 8 callers"),
    ("rss_slope_bytes_per_call", "RSS growth per `Session.Run` of a TVMDSOOp add-one, slope over 100k runs, bytes"),
    ("defop_fused_ratio", f"defop `(x + b) * sigmoid(x + b)`, {DEFOP_SIZE}² float32: TF's unfused ops in a tf.function / "
     "the defop's"),
    ("defop_fused_ratio_vs_xla", "the same: XLA's fusion (jit_compile) / the defop's"),
    ("defop_fused_bias_ratio", f"the same with b a bias of {DEFOP_SIZE} (broadcast: copied first): TF's / the defop's"),
]
#: Reported with the headline keys when present: the tuned bridge (make bench TUNE=N) and the recorded GPU figures.
OPTIONAL_KEYS: Rows = [
    *((f"bridge_tuned_ratio_vs_tf_{m}_b{b}", f"`tf_op.compile(..., tune=N)` of {m}: TF's time / the tuned op's, "
       f"batch {b}") for m in BRIDGE_MODELS for b in MODEL_BATCHES),
    ("legacy_graph_ratio_vs_tvm018", "relay.build MobileNet (TVM 0.18, batch 1): TVMDSOOp's graph executor / TVM "
     "0.18's own on the same library, per call (needs TVM 0.18: tests/legacy/build_fixtures.sh)"),
    ("gpu_call_overhead_us", "GPU: host µs a call of our launch path − a raw launch of the same kernel"),
    ("gpu_bw_ratio_vs_d2d", "GPU: add-one's bandwidth through our path / a device-to-device copy's, 256 MiB"),
]
#: The details, by section (docs/benchmarks.md's prose says what each is).
DETAILS: dict[str, list[str]] = {
    "Per-op ratios (1 and 3)": ["overhead_chain_ratio_vs_tf_add", "per_op_ratio_vs_tf_add_allocating",
                              "speedup_vs_py_function_chain", "overhead_eager_tf_add_us", "overhead_eager_compiled_us",
                              "overhead_eager_func_us"],
    "Go (6)": ["go_session_tvmdsoop_us", "go_session_tf_add_us", "go_session_tvmdsoop_allocating_us",
               "go_session_tf_add_grappler_default_us", "go_dsoop_call_ns", "go_dsoop_direct_c_ns"],
    "Memory (5, 10)": ["memory_baseline_mib", "memory_tf_add_extra_mib", "memory_tvmdsoop_extra_mib",
                       "memory_output_mib", "rss_slope_tf_add_bytes_per_call", "model_rss_slope_bytes_per_call",
                       "model_rss_mib", "vm_instance_rss_kib", "vm_instances", "served_threads"],
}


def cell(r: Results, key: str) -> str:
    """A figure, digits by its size, with its quartiles over rounds when it has them."""
    v = r.get(key, "–")
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


def headline(r: Results) -> list[tuple[str, str]]:  # the headline keys, and the optional ones present
    return KEYS + [(key, what) for key, what in OPTIONAL_KEYS if key in r]


def summary(r: Results) -> str:  # for the terminal
    return table(["key", "median [IQR]", "goal", "met"], [[k, cell(r, k), *goal(r, k)] for k, _ in headline(r)])


def results_part(r: Results) -> str:
    batches, sizes = MODEL_BATCHES, list(LARGE_SIZES)
    contenders = [f"overhead_{c}" for c in ("tf_add", "tvmdsoop", "tvmdsoop_inplace")] + ["pyfunc_tvmdsoop", "pyfunc_py_function"]
    large = ["memcpy", "direct_tvm", "direct_tvm_fresh_out", "tvmdsoop", "tvmdsoop_graph", "tf_add_graph", "old_way"]
    large_ratios = [key for key, _, _ in LARGE_RATIOS] + ["graph_inplace_ratio_vs_direct_tvm"]
    tuned = any(key.startswith("bridge_tuned_") for key in r)
    parts = [
        f"Measured on {r['date']}: {r['cpu_count']} CPUs ({r['cpu_model']}), {r['platform']}; Python "
        f"{r['version_python']}, TensorFlow {r['version_tensorflow']}, apache-tvm {r['version_tvm']}, apache-tvm-ffi "
        f"{r['version_tvm_ffi']}, numpy {r['version_numpy']}; commit {r['git_commit']}; {r['large_rounds']} rounds a "
        f"comparison (1: {r['overhead_processes']} processes, each figure their median; brackets of its per-op ratios: "
        f"their lowest and highest); `make bench` took {cell(r, 'bench_seconds')} s. Other brackets: quartiles over rounds (1's: their medians).",
        table(["key", "what it divides", "median [IQR]", "goal", "met"],
              [[f"`{k}`", what, f"**{cell(r, k)}**", *goal(r, k)] for k, what in headline(r)]),
        "![TVMDSOOp benchmarks](benchmarks.png)",
        "### Per-op cost (1 and 3)",
        table([f"contender (pyfunc: {PY_FUNCTION_SIZE} float32, others 1)", f"µs per call, {CHAIN} applications",
               "µs per call, 1", "µs per application", f"the same, p{PER_OP_PERCENTILE} of {PER_OP_CHAIN}"],
              [[f"`{p}`", *(cell(r, p + s) for s in (f"_x{CHAIN}_us", "_x1_us", "_per_op_us",
                                                     f"_p{PER_OP_PERCENTILE}_per_op_us"))] for p in contenders]),
        "### Large tensors (2 and 4)",
        table(["size", "contender", "ms per call", "GB/s", "of memcpy"],
              [[size, f"`{name}`", *(cell(r, f"large_{size}_{name}_{s}") for s in ("ms", "gbps", "fraction_of_memcpy"))]
               for size in sizes for name in large]),
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
               for key in ("ratio_vs_tvm_vm", "ratio_vs_keras", "overhead_us")]),
        "### `tf_op.compile` against TensorFlow (8), " + ", ".join(f"{k}={r.get('bridge_' + k.lower(), 'unset')}" for k in TVM_BESIDE_TF),
        table(["model", "batch", "TF µs", "compiled op µs", "TF / compiled", "compile s",
               *([f"tuned op µs (tune={r.get('bridge_tune_trials')})", "TF / tuned", "tuning s"] if tuned else [])],
              [[m, str(b), *(cell(r, f"bridge_{m}_b{b}_{s}") for s in ("tf_us", "tvm_us")),
                cell(r, f"bridge_ratio_vs_tf_{m}_b{b}"), cell(r, f"bridge_{m}_b{b}_compile_s"),
                *([cell(r, f"bridge_{m}_b{b}_tuned_us"), cell(r, f"bridge_tuned_ratio_vs_tf_{m}_b{b}"),
                   cell(r, f"bridge_{m}_b{b}_tuned_compile_s")] if tuned else [])]
               for m in BRIDGE_MODELS for b in batches]),
        "### Served throughput (9), requests/s",
        table(["workload", "callers", "TVMDSOOp session", "direct (`dsoop`)", "TF session", "empty session",
               "session / direct", "session / TF", "session in the caller's thread / direct"],
              [[w, str(n), *(cell(r, f"served_{w}_n{n}_{c}_rps") for c in ("session", "direct", "tf", "floor")),
                *(cell(r, f"served_{k}_{w}_n{n}") for k in ("ratio_vs_direct", "ratio_vs_tf", "in_caller_ratio_vs_direct"))]
               for w in SERVED_WORKLOADS for n in SERVED_CALLERS]),
    ]
    parts += peers_part(r)
    for title, keys in DETAILS.items():
        parts += [f"### {title}", table(["key", "value"], [[f"`{k}`", cell(r, k)] for k in keys])]
    if "gpu_date" in r:
        parts.append(f"GPU figures (docs/gpu_results.json): `make test-gpu` on {r['gpu_date']}, {r['gpu_machine']}; "
                     f"{r['gpu_stress_wrong']} values wrong of {r['gpu_stress_calls']} stress rounds.")
    return "\n\n".join(parts)


def peers_rows(r: Results) -> tuple[list[str], list[tuple[str, str]]]:
    """The peers' engines that ran (the tuned one only with --tune) and (model, key prefix) of each row."""
    tuned = bool(r.get("peers_tune_trials"))
    engines = [e for e in PEERS_ENGINES if tuned or not e.startswith("tvm_tuned")]
    return engines, [(f"{m} b{b}", f"peers_{m}_b{b}_") for m in str(r["peers_models"]).split(",") for b in PEERS_MODELS[m]]


def peers_part(r: Results) -> list[str]:
    """11 (when run): µs per call with TF's / the engine's time, seconds to the first output, max errors."""
    if "peers_rounds" not in r:
        return []
    engines, rows = peers_rows(r)

    def speed(p: str, e: str) -> str:
        if why := r.get(f"{p}{e}_skipped"):
            return f"skipped: {why}"
        if e == "tf":
            return cell(r, f"{p}tf_us")
        return f"{cell(r, p + e + '_us')} (×{float(r[p + e + '_vs_tf']):.2f})" + (
            "" if r[f"{p}{e}_ok"] == "yes" else " **wrong**")

    def error(p: str, e: str) -> str:
        if f"{p}{e}_err" not in r:
            return "skipped" if f"{p}{e}_skipped" in r else "–"
        v = float(r[f"{p}{e}_err"])
        return f"{v:.1e}" if v <= PEERS_TOLERANCE else f"**{v:.1e}**"

    def first(p: str, e: str) -> str:
        return "skipped" if f"{p}{e}_skipped" in r else cell(r, f"{p}{e}_first_s")

    header = ["model", *(PEERS_ENGINES[e] for e in engines)]
    return [
        f"### Peers (11): {r['peers_threads']} threads each, {', '.join(k + '=' + str(r['peers_' + k.lower()]) for k in TVM_BESIDE_TF)}; "
        f"onnxruntime {r['peers_version_onnxruntime']}, tf2onnx {r['peers_version_tf2onnx']}, TFLite through "
        f"{r['peers_tflite_interpreter']} (ai-edge-litert {r['peers_version_ai_edge_litert']}); {r['peers_rounds']} rounds",
        "µs per call, median; in parentheses TF's time / the engine's, the median of per-round ratios (above 1: faster than TF)",
        table(header, [[label, *(speed(p, e) for e in engines)] for label, p in rows]),
        "![peers](benchmarks_peers.png)",
        "Seconds to the first output (trace, convert or compile, load, one call; TVM into an empty cache)",
        table(header, [[label, *(first(p, e) for e in engines)] for label, p in rows]),
        f"Max |engine − TF| / max |TF| (bold: over {PEERS_TOLERANCE:g})",
        table(header[:1] + header[2:], [[label, *(error(p, e) for e in engines[1:])] for label, p in rows]),
        *rivals_part(r, engines, rows),
        *auto_part(r, rows),
    ]


def rivals_part(r: Results, engines: list[str], rows: list[tuple[str, str]]) -> list[str]:
    """Ours against TFLite and ONNX Runtime directly: the rival's time / ours in each round, median (bold: ours
    faster). TF's own noise, which the ratios to TF carry, is left out."""
    pairs = [(e, rival) for rival in PEERS_RIVALS for e in engines if e.startswith("tvm")]
    if not any(f"{p}{e}_vs_{rival}" in r for _, p in rows for e, rival in pairs):
        return []  # a run from before these keys

    def ratio(p: str, e: str, rival: str) -> str:
        if f"{p}{e}_vs_{rival}" not in r:
            return "–"
        v = float(r[f"{p}{e}_vs_{rival}"])
        return f"**{v:.2f}**" if v > 1 else f"{v:.2f}"

    return [
        "The rival's time / ours, round by round, median (above 1, bold: ours faster)",
        table(["model", *(f"{PEERS_ENGINES[rival]} / {PEERS_ENGINES[e]}" for e, rival in pairs)],
              [[label, *(ratio(p, e, rival) for e, rival in pairs)] for label, p in rows]),
    ]


def auto_part(r: Results, rows: list[tuple[str, str]]) -> list[str]:
    """tf_op.auto's clusters in the peers run: what became of each, and the share of the model's
    convolution and matmul FLOPs that ran on TVM."""
    kept = [(label, p) for label, p in rows if f"{p}auto_clusters" in r]
    if not kept:
        return []
    return [
        "tf_op.auto: its clusters (status, ops each) and the share of the model's convolution and matmul FLOPs "
        "in clusters kept on TVM",
        table(["model", "clusters", "FLOPs on TVM"],
              [[label, str(r[f"{p}auto_clusters"]), f"{float(r.get(f'{p}auto_tvm_flops_share', 0.0)):.0%}"]
               for label, p in kept]),
    ]


def write_peers_plot(r: Results, path: Path) -> None:
    """TF's time / each engine's, per model and batch: above 1, faster than TF."""
    engines, rows = peers_rows(r)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
    height = 0.8 / (len(engines) - 1)
    for i, e in enumerate(engines[1:]):
        ratios = [float(r.get(f"{p}{e}_vs_tf", float("nan"))) for _, p in rows]
        ax.barh([j + i * height for j in range(len(rows))], ratios, height, label=PEERS_ENGINES[e])
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(rows))], [label for label, _ in rows])
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set(xscale="log", xlabel="TF graph's time / the engine's (above 1: faster than TF; no bar: skipped)",
           title=f"Peers, {r['date']}, {r['peers_threads']} threads ({r['cpu_model']})")
    ax.invert_yaxis()
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plot(r: Results, path: Path) -> None:
    """The headline figures with goals, each over its goal: above 1, the goal is met."""
    keys = [key for key, _ in headline(r) if key in GOALS]
    met = [float(r[k]) / GOALS[k][1] if GOALS[k][0] == ">=" else GOALS[k][1] / float(r[k]) for k in keys]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(keys) + 1.2))
    ax.barh(keys, met, color=["#1f77b4" if m >= 1 else "#d62728" for m in met])
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set(xscale="log", xlabel="figure / goal, inverted for ≤ goals (above 1: met)",
           title=f"TVMDSOOp benchmarks, {r['date']}, {r['cpu_count']} CPUs ({r['cpu_model']})")
    ax.invert_yaxis()
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
    if "peers_rounds" in r:
        write_peers_plot(r, plot.with_name(PEERS_PLOT.name))
