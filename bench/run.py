"""make bench: TVMDSOOp side by side with what it replaces, on the CPU.

    .venv/bin/python bench/run.py [--quick] [--rounds N] [--publish]

Builds the add-one TVM module once (examples/build_add_one.py, in its own process)
and the demo's Keras CNN as Relax VM libraries (tests/modules/keras_cnn.py with
TensorFlow, then tests/modules/build_models.py with TVM, each in its own
process), runs each comparison in one fresh process (bench/compare.py:
contenders timed interleaved, medians of per-round ratios), measures peak memory
in fresh processes (bench/memory.py), then writes build/bench/results.json and
its report, build/bench/benchmarks.md and .png (bench/report.py), and prints a
summary. It changes no tracked file: ``--publish`` (make bench-publish) measures
nothing and writes the last results into docs/benchmarks.md and its plot.

This process imports neither TensorFlow nor TVM.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (
    BENCH_DIR,
    BRIDGE_CACHE,
    BUILD_DIR,
    DOC,
    GOALS,
    GPU_RESULTS,
    LIBRARY,
    MEMORY_SIZE,
    MODEL_BATCHES,
    MODELS_DIR,
    PLOT,
    PROFILE_NOTES,
    RESULTS,
    ROOT,
    VM_DIRECT,
    goal_met,
)
from report import KEYS, write_markdown

Results = dict[str, float | int | str]

#: Comparisons run by bench/compare.py, each in its own process, in this order.
COMPARISONS = ("overhead", "overhead_grappler", "py_function", "large", "model")


def _run(args: list[str], what: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs a child Python script; on failure shows its stderr and stops."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"bench: {what} failed (exit status {proc.returncode})")
    print(f"  {what}: {time.perf_counter() - started:.1f} s", flush=True)
    return proc


def build_module() -> Path:
    """Compiles the demo's add_one (examples/build_add_one.py) with TVM in a child
    process, unless it is up to date; written aside and renamed, so a half-written
    library is never picked up."""
    script = ROOT / "examples" / "build_add_one.py"
    if LIBRARY.is_file() and LIBRARY.stat().st_mtime >= script.stat().st_mtime:
        print(f"  add-one module: {LIBRARY.relative_to(ROOT)} (up to date)")
        return LIBRARY
    LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    partial = LIBRARY.with_name(LIBRARY.name + ".partial.so")
    _run([str(script), str(partial)], f"TVM build of {LIBRARY.relative_to(ROOT)}", timeout=300)
    partial.replace(LIBRARY)
    return LIBRARY


def build_models() -> Path:
    """The demo's Keras CNN at each batch of MODEL_BATCHES as Relax VM libraries
    (MODELS_DIR/cnn_b{B}.so), unless up to date: converted to TFLite in a child
    that imports TensorFlow, compiled in another that imports TVM (their LLVMs
    clash in one process). build_models.py also builds its small test models;
    keras_cnn.py also writes the Keras model as a SavedModel (cnn_savedmodel), what
    the Go served benchmark serves as TF's contender."""
    modules = ROOT / "tests" / "modules"
    keras_cnn, build_models_py = modules / "keras_cnn.py", modules / "build_models.py"
    newest_script = max(keras_cnn.stat().st_mtime, build_models_py.stat().st_mtime)
    wanted = [MODELS_DIR / f"cnn_b{b}.so" for b in MODEL_BATCHES]
    made = [*wanted, MODELS_DIR / "cnn.keras", MODELS_DIR / "cnn_savedmodel"]
    if all(p.exists() and p.stat().st_mtime >= newest_script for p in made):
        print(f"  CNN models: {MODELS_DIR.relative_to(ROOT)}/cnn_b*.so (up to date)")
        return MODELS_DIR
    batches = [str(b) for b in MODEL_BATCHES]
    _run([str(keras_cnn), str(MODELS_DIR), "--batch", *batches], "Keras CNN -> TFLite", timeout=300)
    _run([str(build_models_py), str(MODELS_DIR)], f"TVM build of {MODELS_DIR.relative_to(ROOT)}", timeout=600)
    missing = [p.name for p in wanted if not p.is_file()]
    if missing:
        raise SystemExit(f"bench: build_models.py wrote no {', '.join(missing)}")
    return MODELS_DIR


def run_comparison(name: str, rounds: int) -> Results:
    out = BUILD_DIR / f"{name}.json"
    out.unlink(missing_ok=True)
    # The model comparison runs the CNN libraries; the others, the add-one library.
    target = MODELS_DIR if name == "model" else LIBRARY
    _run(
        [str(BENCH_DIR / "compare.py"), name, str(target), str(out), "--rounds", str(rounds)],
        f"comparison {name}",
        timeout=240,
    )
    results: Results = json.loads(out.read_text())
    return results


def run_memory(repeats: int) -> Results:
    """Peak RSS of baseline / TVMDSOOp / tf.add processes, interleaved, medians."""
    peaks: dict[str, list[float]] = {"baseline": [], "tvmdsoop": [], "tf_add": []}
    started = time.perf_counter()
    for _ in range(repeats):
        for mode in peaks:
            proc = subprocess.run(
                [sys.executable, str(BENCH_DIR / "memory.py"), mode, str(LIBRARY), str(MEMORY_SIZE)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-8000:])
                raise SystemExit(f"bench: memory {mode} failed (exit status {proc.returncode})")
            peaks[mode].append(json.loads(proc.stdout.strip().splitlines()[-1])["maxrss_kib"] / 1024)
    print(f"  memory ({3 * repeats} processes): {time.perf_counter() - started:.1f} s", flush=True)
    out: Results = {"memory_repeats": repeats, "memory_output_mib": MEMORY_SIZE * 4 / 2**20}
    base = statistics.median(peaks["baseline"])
    out["memory_baseline_mib"] = base
    for mode in ("tvmdsoop", "tf_add"):
        out[f"memory_{mode}_mib"] = statistics.median(peaks[mode])
        out[f"memory_{mode}_extra_mib"] = statistics.median(peaks[mode]) - base
    out["peak_rss_ratio_vs_tf_add"] = float(out["memory_tvmdsoop_extra_mib"]) / float(out["memory_tf_add_extra_mib"])
    return out


def _cgo_environment() -> dict[str, str]:
    """The environment `go test` needs: build/cgo.mk's exports (make build)."""
    env = dict(os.environ)
    for line in (BUILD_DIR.parent / "cgo.mk").read_text().splitlines():
        if line.startswith("export ") and ":=" in line:
            name, value = line[len("export ") :].split(":=", 1)
            env[name.strip()] = value.strip()
    return env


#: Go benchmarks: (package, benchmarks, rounds) and the metric -> key they give;
#: None: every metric but ns/op, under its own name. 1x: the benchmark runs once,
#: with its own rounds.
GO_BENCHMARKS = (
    ("./dsoop", "BenchmarkCallOverhead", 9, {
        "go-ns/call": "go_dsoop_call_ns", "c-ns/call": "go_dsoop_direct_c_ns",
        "overhead-ns/call": "go_dsoop_overhead_ns",
    }),
    ("./tfbridge", "BenchmarkSessionChain", 15, {
        "ratio": "go_session_ratio_vs_tf_add", "tvmdsoop-us/run": "go_session_tvmdsoop_us",
        "tf_add-us/run": "go_session_tf_add_us",
    }),
    ("./tfbridge", "BenchmarkServed|BenchmarkRSS", 1, None),
)


def run_go_benchmarks() -> Results:
    """Items 6 and 9: the Go benchmarks, each timing its contenders interleaved."""
    out: Results = {}
    env = {**_cgo_environment(), "TVMDSOOP_BENCH_MODELS": str(MODELS_DIR), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for package, name, rounds, metrics in GO_BENCHMARKS:
        started = time.perf_counter()
        proc = subprocess.run(
            ["go", "test", "-run", "^$", "-bench", f"^({name})$", "-benchtime", f"{rounds}x", package],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("Benchmark")]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"bench: go benchmark {name} failed")
        for line in lines:  # the last line of a benchmark is its measured run
            fields = line.split()
            for value, unit in zip(fields[2::2], fields[3::2]):
                if metrics is None and unit != "ns/op":
                    out[unit] = float(value)
                elif metrics is not None and unit in metrics:
                    out[metrics[unit]] = float(value)
        print(f"  go {name}: {time.perf_counter() - started:.1f} s", flush=True)
    return out


def recorded_gpu() -> Results:
    """The GPU figures `make test-gpu` recorded on a GPU machine (bench/gpu_results.json)."""
    if not GPU_RESULTS.is_file():
        return {}
    recorded: Results = json.loads(GPU_RESULTS.read_text())
    print(f"  GPU: recorded on {recorded['gpu_date']} ({recorded['gpu_name']}), from {GPU_RESULTS.relative_to(ROOT)}")
    return recorded


def _version(*distributions: str) -> str:
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    """HEAD, with "+dirty" when the tree has changes (read-only git commands)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def environment() -> Results:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_count": os.cpu_count() or 0,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "version_python": platform.python_version(),
        "version_tensorflow": _version("tensorflow-cpu", "tensorflow"),
        "version_tvm": _version("apache-tvm"),
        "version_tvm_ffi": _version("apache-tvm-ffi"),
        "version_numpy": _version("numpy"),
        "version_matplotlib": _version("matplotlib"),
    }


def summary(results: Results) -> str:
    lines = ["", f"{'key':<34} {'median':>9}  {'goal':<8} met", "-" * 58]
    for key, _ in KEYS:
        value = float(results[key])
        if key in GOALS:
            op, bound = GOALS[key]
            goal, met = f"{op} {bound:g}", "yes" if goal_met(key, value) else "NO"
        else:
            goal, met = "-", "-"
        lines.append(f"{key:<34} {value:>9.2f}  {goal:<8} {met}")
    lines += [
        "",
        f"per application: TVMDSOOp {float(results['overhead_tvmdsoop_per_op_us']):.2f} us, "
        f"tf.add {float(results['overhead_tf_add_per_op_us']):.2f} us, "
        f"py_function {float(results['pyfunc_py_function_per_op_us']):.1f} us",
        f"16M add-one: TVMDSOOp {float(results['large_16M_tvmdsoop_gbps']):.1f} GB/s, "
        f"direct {float(results['large_16M_direct_tvm_gbps']):.1f} GB/s, "
        f"memcpy {float(results['large_16M_memcpy_gbps']):.1f} GB/s",
        "Keras CNN, per call in a tf.function: "
        + "; ".join(
            f"batch {b}: TVMDSOOp {float(results[f'model_b{b}_tvmdsoop_per_call_us']):.0f} us, "
            f"TVM VM from C {float(results[f'model_b{b}_tvm_vm_per_call_us']):.0f} us, "
            f"Keras {float(results[f'model_b{b}_keras_per_call_us']):.0f} us"
            for b in MODEL_BATCHES
        ),
        f"memory: +{float(results['memory_tvmdsoop_extra_mib']):.0f} MiB (TVMDSOOp), "
        f"+{float(results['memory_tf_add_extra_mib']):.0f} MiB (tf.add), one output = "
        f"{float(results['memory_output_mib']):.0f} MiB",
        f"Go: session run {float(results['go_session_tvmdsoop_us']):.1f} us (TVMDSOOp chain) "
        f"vs {float(results['go_session_tf_add_us']):.1f} us (AddV2 chain); "
        f"dsoop.Func.Call {float(results['go_dsoop_call_ns']):.0f} ns vs "
        f"{float(results['go_dsoop_direct_c_ns']):.1f} ns from C",
    ]
    if "gpu_call_overhead_us" in results:
        lines.append(
            f"GPU (recorded {results['gpu_date']}, {results['gpu_name']}): call overhead "
            f"{float(results['gpu_call_overhead_us']):.2f} us (goal <= 3), bandwidth "
            f"{float(results['gpu_bw_ratio_vs_d2d']):.2f} of a device-to-device copy (goal >= 0.85)"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and memory processes")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per comparison (default 15, quick 5)")
    parser.add_argument(
        "--publish", action="store_true",
        help=f"write {RESULTS.relative_to(ROOT)} into {DOC.relative_to(ROOT)} and its plot, measure nothing",
    )
    args = parser.parse_args(argv)
    if args.publish:
        stored: Results = json.loads(RESULTS.read_text())
        write_markdown(stored, DOC, PLOT, PROFILE_NOTES)
        print(summary(stored))
        print(f"wrote {DOC.relative_to(ROOT)}, {PLOT.relative_to(ROOT)}")
        return
    rounds = args.rounds or (5 if args.quick else 15)
    started = time.perf_counter()
    print(f"bench: {rounds} interleaved rounds per comparison", flush=True)
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    if not VM_DIRECT.is_file():
        raise SystemExit(f"bench: {VM_DIRECT.relative_to(ROOT)} is missing: run `make build` (make bench does)")
    build_module()
    build_models()
    results: Results = environment()
    for name in COMPARISONS:
        results.update(run_comparison(name, rounds))
    results.update(run_memory(2 if args.quick else 3))
    results.update(run_go_benchmarks())
    results.update(recorded_gpu())
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    missing = [key for key, _ in KEYS if key not in results]
    if missing:
        raise SystemExit(f"bench: no figure for {', '.join(missing)}")
    RESULTS.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")
    write_markdown(results, BUILD_DIR / DOC.name, BUILD_DIR / PLOT.name, PROFILE_NOTES)
    print(summary(results))
    print(f"wrote {RESULTS.relative_to(ROOT)} and its report, {(BUILD_DIR / DOC.name).relative_to(ROOT)}; "
          "`make bench-publish` puts them in docs/")
    print(f"bench: {results['bench_seconds']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
