"""make bench's relay.build comparison: MobileNet (tests/legacy/fixtures: TVM 0.18's relay.testing.mobilenet,
batch 1, its params generated) through TVMDSOOp's graph executor / through TVM 0.18's own graph executor, on the
same library. TVM 0.18 is JavaCPP's build from Maven, which tests/legacy/build_fixtures.sh fetches into
build/legacy-tvm (or $TVMDSOOP_LEGACY_TVM): without it the comparison is skipped.

    .venv/bin/python bench/legacy_graph.py ROUNDS      prints {"legacy_graph_ratio_vs_tvm018": ..., ...} (JSON)

Each side runs in a process of its own (TVM 0.18 and TensorFlow's TVM would clash in one), serving timing requests
on stdin, so that their rounds interleave. A side's call: set the input, run, read the output back, as a user of
either does (TVM's set_input/run/get_output; the op copies in and out too).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "legacy" / "fixtures"
CALLS = 10  # per round and side: MobileNet takes 10-100 ms a call


def serve(call) -> None:
    """Answers each line N on stdin with the seconds N calls took."""
    call()  # warm: thread pools, workspace
    print("ready", flush=True)
    for line in sys.stdin:
        started = time.perf_counter()
        for _ in range(int(line)):
            call()
        print(time.perf_counter() - started, flush=True)


def tvm018() -> None:
    sys.path.insert(0, str(FIXTURES.parent))
    import tvm  # TVM 0.18: build_fixtures.sh's environment
    from fixtures import legacy_params, legacy_values
    from tvm.contrib import graph_executor

    graph = (FIXTURES / "mobilenet.json").read_text()
    m = graph_executor.create(graph, tvm.runtime.load_module(str(FIXTURES / "mobilenet_lib.so")), tvm.cpu())
    m.set_input(**legacy_params(graph))
    data = legacy_values("data", (1, 3, 224, 224), 1.0)

    def call() -> None:
        m.set_input("data", data)
        m.run()
        m.get_output(0).numpy()

    serve(call)


def op() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import tensorflow as tf
    import tf_op
    from test_legacy import DIGESTS, legacy_values, mobilenet_params, param_blob

    params = ROOT / "build" / "bench" / "mobilenet.params"
    params.parent.mkdir(parents=True, exist_ok=True)
    params.write_bytes(param_blob(mobilenet_params(FIXTURES / "mobilenet.json")))
    net = tf_op.Module(FIXTURES / "mobilenet_lib.so", sha256=DIGESTS["mobilenet_lib.so"],
                       graph_json=FIXTURES / "mobilenet.json", params=params).func("default", output_shape=[1, 1000])
    x = tf.constant(legacy_values("data", (1, 3, 224, 224), 1.0))
    serve(lambda: net(x).numpy())


def legacy_tvm_env() -> dict[str, str] | None:
    """The environment that runs TVM 0.18's Python package, or None where it was not fetched."""
    cache = Path(os.environ.get("TVMDSOOP_LEGACY_TVM", ROOT / "build" / "legacy-tvm"))
    tvm = cache / "tvm" / "org" / "bytedeco" / "tvm" / "linux-x86_64"
    if not (tvm / "python" / "tvm").is_dir():
        return None
    libs = [cache / a / "org" / "bytedeco" / a / "linux-x86_64" for a in ("llvm", "dnnl")]
    return {**os.environ, "PYTHONPATH": str(tvm / "python"), "TVM_LIBRARY_PATH": str(tvm / "python" / "tvm"),
            "LD_LIBRARY_PATH": ":".join(map(str, libs))}


def compare(rounds: int) -> dict[str, float]:
    env = legacy_tvm_env()
    if env is None:
        return {}
    sides = {
        "tvm018": subprocess.Popen([sys.executable, __file__, "--serve", "tvm018"], env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True),
        "op": subprocess.Popen([sys.executable, __file__, "--serve", "op"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True),
    }
    try:
        for name, p in sides.items():
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"bench: the {name} side of the relay.build comparison failed to start")
        per_call: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, p in sides.items():
                p.stdin.write(f"{CALLS}\n")
                p.stdin.flush()
                per_call[name].append(float(p.stdout.readline()) / CALLS)
    finally:
        for p in sides.values():
            p.stdin.close()
            p.wait(timeout=60)
    ratios = [a / b for a, b in zip(per_call["op"], per_call["tvm018"], strict=True)]
    return {"legacy_graph_ratio_vs_tvm018": statistics.median(ratios),
            "legacy_graph_op_ms": 1000 * statistics.median(per_call["op"]),
            "legacy_graph_tvm018_ms": 1000 * statistics.median(per_call["tvm018"])}


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        {"tvm018": tvm018, "op": op}[sys.argv[2]]()
    else:
        print(json.dumps(compare(int(sys.argv[1]))))
