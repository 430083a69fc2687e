"""The per-call path of TVMDSOOp, for a profiler.

    .venv/bin/python bench/profile_op.py [--op tvmdsoop|tvmdsoop_inplace|tf_add] [--calls N] [--callgrind]

Runs a tf.function applying add-one CHAIN times to a 1-element float32 tensor
(comparison 1 of bench/run.py, Grappler folding off), ``N`` times. With
``--callgrind`` the script expects to run under
``valgrind --tool=callgrind --instr-atstart=no`` and switches instrumentation on
(``callgrind_control -i on``) only after the imports and the warm-up, so that the
profile holds the steady-state calls alone. bench/profile.md shows the commands
and what they found.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from common import CHAIN, LIBRARY, quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("tvmdsoop", "tvmdsoop_inplace", "tf_add"), default="tvmdsoop")
    parser.add_argument("--calls", type=int, default=2000, help="tf.function calls to profile")
    parser.add_argument("--callgrind", action="store_true", help="toggle callgrind instrumentation around the loop")
    args = parser.parse_args(argv)

    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False, "constant_folding": False})
    inplace = {0: 0} if args.op == "tvmdsoop_inplace" else None
    add_one = tf_op.Module(LIBRARY).func("add_one", inplace=inplace)

    def tf_add_one(x: tf.Tensor) -> tf.Tensor:
        return tf.add(x, 1.0)

    op = tf_add_one if args.op == "tf_add" else add_one

    def chain(x: tf.Tensor) -> tf.Tensor:
        for _ in range(CHAIN):
            x = op(x)
        return x

    applied = tf.function(chain, input_signature=[tf.TensorSpec([1], tf.float32)])

    x = tf.constant([0.0])
    for _ in range(20):
        applied(x)
    if args.callgrind:
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    start = time.perf_counter()
    for _ in range(args.calls):
        applied(x)
    elapsed = time.perf_counter() - start
    if args.callgrind:
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)
    print(f"{args.op}: {args.calls} calls of {CHAIN} applications, {elapsed / args.calls * 1e6:.1f} us per call")


if __name__ == "__main__":
    main(sys.argv[1:])
