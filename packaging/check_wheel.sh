#!/usr/bin/env bash
# Installs the binary wheel as a user would, in a clean venv with TensorFlow
# VERSION and nothing but that venv's Python on PATH (no Go, CMake or compiler),
# then runs a TVM function in a TF graph and `tvmdsoop inspect` on its library:
#
#   packaging/check_wheel.sh VERSION [WHEEL]     (WHEEL: dist/tvmdsoop-*.whl)
#
# The function is examples/build_add_one.py's, compiled by the project's .venv
# (`make setup`). The venv installs the wheel's [compile] extra (the TVM runtime
# a tvm.compile'd library needs, and tf_op.compile's compiler), compiles a
# function with tf_op.compile there, and checks that [tune] after it would
# change none of what [compile] installed (the extras compose).
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 VERSION [WHEEL]" >&2; exit 2; }
version=$1
cd "$(dirname "$0")/.."  # the repository root
wheel=${2:-$(ls dist/tvmdsoop-*.whl | tail -n 1)}
wheel=$(realpath "$wheel")
[[ -f requirements/tf-$version.txt ]] || { echo "$0: no requirements/tf-$version.txt" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python examples/build_add_one.py "$work/add_one.so"

echo "== TensorFlow $version: a clean venv, the wheel from $wheel"
python3 -m venv "$work/venv"
# Only the venv on PATH: what pip and the package need must come from the wheels.
clean=(env -i "HOME=$HOME" "PATH=$work/venv/bin" "TMPDIR=${TMPDIR:-/tmp}" "TF_CPP_MIN_LOG_LEVEL=2"
  "TVMDSOOP_CACHE_DIR=$work/cache")
pins=$(grep -E '^(tensorflow-cpu|numpy)==' "requirements/tf-$version.txt")
# shellcheck disable=SC2086  # one argument per pin
"${clean[@]}" pip install --quiet --disable-pip-version-check $pins "$wheel[compile]"

"${clean[@]}" python - "$work/add_one.so" "$version" <<'PY'
import sys

import numpy as np
import tensorflow as tf

import tf_op
from tf_op import _library

library, version = sys.argv[1], sys.argv[2]
assert tf.__version__.startswith(version + "."), tf.__version__
assert f"/_ops/tf{version}/" in str(_library.library_path()), _library.library_path()
add_one = tf_op.Module(library).func("add_one")


@tf.function(input_signature=[tf.TensorSpec([None], tf.float32)], autograph=False)
def graph(x: tf.Tensor) -> tf.Tensor:
    return add_one(x)


x = np.arange(5, dtype=np.float32)
np.testing.assert_array_equal(graph(x).numpy(), x + 1)
print(f"TensorFlow {tf.__version__}: add_one in a graph from the wheel's {_library.library_path().parent.name}")

compiled = tf_op.compile(lambda v: tf.nn.relu(v) * 2.0, input_signature=[tf.TensorSpec([5], tf.float32)])
np.testing.assert_array_equal(compiled(x - 2).numpy(), np.maximum(x - 2, 0) * 2)
# Called eagerly through the wheel's eager entry (a CPython extension), not TF's op dispatch.
(kept,) = compiled._state.compiled.values()
assert type(kept.func._eager.call).__module__ == "tf_op._eager_entry", kept.func._eager.call
# The second compile is the kept worker's: it links with ziglang again.
halved = tf_op.compile(lambda v: v * 0.5, input_signature=[tf.TensorSpec([5], tf.float32)])
np.testing.assert_array_equal(halved(x).numpy(), x * 0.5)
print(f"TensorFlow {tf.__version__}: tf_op.compile from the wheel's [compile] extra, twice")
PY

# The extras compose: [tune] after [compile] only adds.
changes=$("${clean[@]}" pip install --dry-run --disable-pip-version-check $pins "$wheel[tune]" | grep '^Would install' || true)
for kept in apache-tvm-ffi apache-tvm tflite tensorflow; do
  if grep -qE "(^| )$kept-[0-9]" <<<"$changes"; then
    echo "$0: [tune] after [compile] would reinstall $kept: $changes" >&2
    exit 1
  fi
done
echo "[tune] after [compile]: ${changes:-nothing to install}"

inspected=$("${clean[@]}" tvmdsoop inspect "$work/add_one.so" --json)
"${clean[@]}" python - "$inspected" "$(sha256sum "$work/add_one.so" | cut -d' ' -f1)" <<'PY'
import json
import sys

report, digest = json.loads(sys.argv[1]), sys.argv[2]
assert "add_one" in report["functions"], report
assert report["sha256"] == digest, (report["sha256"], digest)
print(f"tvmdsoop inspect: functions {report['functions']}, sha256 {digest[:16]}...")
PY
