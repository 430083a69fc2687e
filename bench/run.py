"""make bench: TVMDSOOp side by side with what it replaces, on the CPU (docs/benchmarks.md).

    .venv/bin/python bench/run.py [--quick] [--rounds N] [--tune TRIALS] [--publish]

Writes build/bench/results.json and the report into build/bench/, changing no tracked file;
--publish (make bench-publish) measures nothing and writes the last results into docs/.
This process imports neither TensorFlow nor TVM.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import (BENCH_DIR, BUILD_DIR, DEFOPS, DOC, GPU_RESULTS, LIBRARY, MEMORY_SIZE, MODEL_BATCHES, MODELS_DIR,
                    PEERS_QUICK, PLOT, RESULTS, ROOT, VM_DIRECT, Results)
from report import KEYS, summary, write_report


#: bench/compare.py's comparisons, each in its own process, with its time limit in seconds (the bridge compiles
#: MobileNetV2 twice, 10-60 s each, and times it; the peers compile 11 models x batches four ways, 224x224 ones too).
COMPARISONS = {"overhead": 300, "py_function": 300, "large": 300, "model": 300, "defop": 300, "bridge": 1200,
               "peers": 2400}
TUNED_CELLS = {"bridge": 8, "peers": 11}  # models x batches that --tune tunes: minutes each, ~2 s a trial
#: "overhead" runs in 4 processes, each key their median: a per-op slope differs more between processes (where code
#: and heap land) than between rounds. Per-op ratio brackets: lowest, highest; NaN stays NaN.
OVERHEAD_PROCESSES, PER_OP_RATIOS = 4, ("per_op_ratio_vs_tf_add", "per_op_ratio_vs_tf_add_allocating")
#: Go benchmarks: package, benchmarks, rounds, and the metric -> key they give (None:
#: every metric but ns/op, under its own name; 1 round: it runs its own rounds).
GO_BENCHMARKS = (("./dsoop", "BenchmarkCallOverhead", 9, {"go-ns/call": "go_dsoop_call_ns", "c-ns/call":
                  "go_dsoop_direct_c_ns", "overhead-ns/call": "go_dsoop_overhead_ns"}),
                 ("./tfbridge", "BenchmarkSessionChain", 15, {"ratio": "go_session_ratio_vs_tf_add", **{f"{c}-us/run": (
                  f"go_session_{c}_us") for c in ("tvmdsoop", "tf_add", "tvmdsoop_allocating", "tf_add_grappler_default")}}),
                 ("./tfbridge", "BenchmarkServed|BenchmarkRSS", 1, None))


def run(command: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs a child (a Python script, or a command) and returns its stdout; stops on failure."""
    started = time.perf_counter()
    command = [sys.executable, *command] if command[0].endswith(".py") or command[0] == "-m" else command
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"bench: {what} failed (exit status {proc.returncode})")
    print(f"  {what}: {time.perf_counter() - started:.1f} s", flush=True)
    return proc.stdout


def build_libraries() -> None:
    """The demo's add-one (written aside: a half-written one is never taken for up to date),
    and the Keras CNN at each batch: TFLite, then TVM (their LLVMs clash in one process)."""
    def stale(outputs: list[Path], *scripts: str) -> bool:
        newest = max((ROOT / script).stat().st_mtime for script in scripts)
        return not all(p.exists() and p.stat().st_mtime >= newest for p in outputs)

    if stale([LIBRARY], "examples/build_add_one.py"):
        partial = LIBRARY.with_name("add_one.partial.so")
        run(["examples/build_add_one.py", str(partial)], "TVM add-one", timeout=300)
        partial.replace(LIBRARY)
    if stale([DEFOPS], "tests/modules/defops.py", "python/tf_op_tvm/build_ops.py"):
        run(["-m", "tf_op_tvm.build_ops", "tests/modules/defops.py", "-o", str(DEFOPS)], "defops", timeout=300)
    batches = [str(b) for b in MODEL_BATCHES]
    models = [*(MODELS_DIR / f"cnn_b{b}.so" for b in batches), MODELS_DIR / "cnn.keras", MODELS_DIR / "cnn_savedmodel"]
    if stale(models, "tests/modules/keras_cnn.py", "tests/modules/build_models.py"):
        run(["tests/modules/keras_cnn.py", str(MODELS_DIR), "--batch", *batches], "Keras CNN -> TFLite", timeout=300)
        run(["tests/modules/build_models.py", str(MODELS_DIR)], "TVM models", timeout=600)
        if missing := [p.name for p in models if not p.exists()]:
            raise SystemExit(f"bench: build_models.py wrote no {', '.join(missing)}")


def run_memory(repeats: int) -> Results:
    """Peak RSS of baseline / TVMDSOOp / tf.add processes, interleaved, medians."""
    peaks: dict[str, list[float]] = {"baseline": [], "tvmdsoop": [], "tf_add": []}
    for _ in range(repeats):
        for mode, values in peaks.items():
            stdout = run([str(BENCH_DIR / "compare.py"), "memory", mode], f"memory {mode}", timeout=120)
            values.append(json.loads(stdout.strip().splitlines()[-1])["maxrss_kib"] / 1024)
    out: Results = {"memory_repeats": repeats, "memory_output_mib": MEMORY_SIZE * 4 / 2**20,
                    **{f"memory_{mode}_mib": float(np.median(values)) for mode, values in peaks.items()}}
    for mode in ("tvmdsoop", "tf_add"):
        out[f"memory_{mode}_extra_mib"] = float(out[f"memory_{mode}_mib"]) - float(out["memory_baseline_mib"])
    out["peak_rss_ratio_vs_tf_add"] = float(out["memory_tvmdsoop_extra_mib"]) / float(out["memory_tf_add_extra_mib"])
    return out


def run_go_benchmarks() -> Results:
    """6 and 9: the Go benchmarks, each timing its contenders interleaved, with build/cgo.mk's environment."""
    env = {**os.environ, "TVMDSOOP_BENCH_MODELS": str(MODELS_DIR), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for line in (BUILD_DIR.parent / "cgo.mk").read_text().splitlines():
        if line.startswith("export ") and ":=" in line:
            name, value = line[len("export "):].split(":=", 1)
            env[name.strip()] = value.strip()
    out: Results = {}
    for package, name, rounds, metrics in GO_BENCHMARKS:
        stdout = run(["go", "test", "-run", "^$", "-bench", f"^({name})$", "-benchtime", f"{rounds}x", package],
                     f"go {name}", timeout=600, env=env)
        lines = [line.split() for line in stdout.splitlines() if line.startswith("Benchmark")]
        if not lines:
            raise SystemExit(f"bench: go benchmark {name} printed no figures:\n{stdout[-4000:]}")
        for fields in lines:  # the last line of a benchmark is its measured run
            for value, unit in zip(fields[2::2], fields[3::2]):
                if (metrics is None and unit != "ns/op") or (metrics and unit in metrics):
                    out[metrics[unit] if metrics else unit] = float(value)
    return out


def environment() -> Results:
    def version(dist: str) -> str:
        return next((d.version for d in importlib.metadata.distributions(name=dist)), "")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    cpu = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
           if line.startswith("model name")]
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu_count": os.cpu_count() or 0,
        "cpu_model": cpu[0] if cpu else platform.processor(), "platform": platform.platform(),
        "git_commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "-uno") else ""),
        "version_python": platform.python_version(), "version_tensorflow": version("tensorflow-cpu") or version("tensorflow"),
        **{f"version_{d.removeprefix('apache-').replace('-', '_')}": version(d)
           for d in ("apache-tvm", "apache-tvm-ffi", "numpy", "matplotlib")},
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and memory processes, the small peers only")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per comparison (default 15, quick 5)")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS", help="also the bridge and peers models tuned")
    parser.add_argument("--publish", action="store_true", help="the last results into docs/, measure nothing")
    args = parser.parse_args(argv)
    if args.publish:
        write_report(stored := json.loads(RESULTS.read_text()), DOC, DOC, PLOT)
        return print(f"{summary(stored)}\nwrote {DOC.relative_to(ROOT)}, {PLOT.relative_to(ROOT)}")
    rounds, started = args.rounds or (5 if args.quick else 15), time.perf_counter()
    print(f"bench: {rounds} interleaved rounds per comparison", flush=True)
    if not VM_DIRECT.is_file():
        raise SystemExit(f"bench: {VM_DIRECT.relative_to(ROOT)} is missing: run `make build` (make bench does)")
    build_libraries()
    results: Results = environment()
    for name, timeout in COMPARISONS.items():
        out, tuning = BUILD_DIR / f"{name}.json", ["--tune", str(args.tune)] if name in TUNED_CELLS and args.tune else []
        models = ["--models", ",".join(PEERS_QUICK)] if name == "peers" and args.quick else []
        each: list[Results] = []
        for _ in range(OVERHEAD_PROCESSES if name == "overhead" else 1):
            run([str(BENCH_DIR / "compare.py"), name, "--out", str(out), "--rounds", str(rounds), *tuning, *models],
                f"comparison {name}", timeout=timeout + (TUNED_CELLS[name] * (120 + 2 * args.tune) if tuning else 0))
            each.append(json.loads(out.read_text()))
        results.update({k: float(np.median([o[k] for o in each])) if isinstance(v, float) else v for k, v in each[0].items()})
        if name == "overhead":
            results.update({"overhead_processes": len(each), **{f"{k}_{q}": float(f([o[k] for o in each]))
                            for k in PER_OP_RATIOS for q, f in (("q1", np.min), ("q3", np.max))}})
    # relay.build's MobileNet / TVM 0.18's graph executor: {} where TVM 0.18 was not fetched (build_fixtures.sh).
    results.update(json.loads(run([str(BENCH_DIR / "legacy_graph.py"), str(rounds)], "relay.build MobileNet",
                                  timeout=600).splitlines()[-1]))
    results.update(run_memory(2 if args.quick else 3))
    results.update(run_go_benchmarks())
    if GPU_RESULTS.is_file():  # recorded by make test-gpu on a GPU machine
        results.update(json.loads(GPU_RESULTS.read_text()))
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    if missing := [key for key, _ in KEYS if key not in results]:
        raise SystemExit(f"bench: no figure for {', '.join(missing)}")
    RESULTS.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")
    write_report(results, DOC, BUILD_DIR / DOC.name, BUILD_DIR / PLOT.name)
    print(f"{summary(results)}\nwrote {RESULTS.relative_to(ROOT)} and {(BUILD_DIR / DOC.name).relative_to(ROOT)}; "
          f"`make bench-publish` puts them in docs/\nbench: {results['bench_seconds']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
