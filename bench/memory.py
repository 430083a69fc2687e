"""Peak resident memory of one add-one on a large tensor, in a fresh process.

    python bench/memory.py {baseline,tvmdsoop,tf_add} LIB ELEMENTS

Prints one JSON object: the mode and the process's peak RSS (``ru_maxrss``, KiB).
Every mode does the same preamble (imports, one add-one of each kind on a
1-element tensor, so that the op library, the TVM runtime and the module are
loaded in all of them), then creates the input with ``tf.fill``; ``baseline``
stops there, the others apply add-one once. bench/run.py subtracts the baseline.
"""

from __future__ import annotations

import json
import resource
import sys

from common import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

import tf_op  # noqa: E402

MODES = ("baseline", "tvmdsoop", "tf_add")


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[0] not in MODES:
        sys.exit(f"usage: memory.py {{{','.join(MODES)}}} LIB ELEMENTS")
    mode, lib, elements = argv[0], argv[1], int(argv[2])
    add_one = tf_op.Module(lib).func("add_one")
    small = tf.constant([0.0], dtype=tf.float32)
    if float(add_one(small)[0]) != 1.0 or float(tf.add(small, 1.0)[0]) != 1.0:
        raise AssertionError("add-one is wrong on one element")
    x = tf.fill([elements], 1.0)
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    y: tf.Tensor | None = None
    if mode == "tvmdsoop":
        y = add_one(x)
    elif mode == "tf_add":
        y = tf.add(x, 1.0)
    if y is not None and float(y[-1]) != 2.0:
        raise AssertionError(f"{mode}: wrong result")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "maxrss_kib": peak_kib, "maxrss_before_kib": before_kib}))


if __name__ == "__main__":
    main(sys.argv[1:])
