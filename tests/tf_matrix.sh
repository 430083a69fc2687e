#!/usr/bin/env bash
# One leg of the TensorFlow matrix: builds the op library against TensorFlow
# VERSION and runs the core Python tests with it.
#
#   tests/tf_matrix.sh VERSION        (2.18, 2.19, 2.20 or 2.21)
#
# Everything of the leg is its own: the venv .venv-tfVERSION, made once from
# requirements/tf-VERSION.txt, and the build folder build-tfVERSION, where
# tvmdsoop-probe lies beside libtvm_dso_op.so (the op finds it there). That venv
# has no TVM compiler: the test libraries are built by the project's .venv
# (`make setup`), named to the tests by TVMDSOOP_TVM_PYTHON, whose TVM runtime
# the op then loads (tests/python/conftest.py). TVM never enters the TF process.
set -euo pipefail

# packaging/tf_build.sh checks VERSION, and names those there are.
[[ $# -eq 1 ]] || { echo "usage: $0 VERSION" >&2; exit 2; }
version=$1
cd "$(dirname "$0")/.."  # the repository root

tvm_python=$PWD/.venv/bin/python
if [[ ! -x $tvm_python ]]; then
  echo "$0: $tvm_python is missing: the test libraries are built by the project's" \
    ".venv (apache-tvm); run \`make setup\` first" >&2
  exit 1
fi

build=build-tf$version
TVMDSOOP_BUILD_DIR=$build packaging/tf_build.sh "$version"
python=$PWD/.venv-tf$version/bin/python

echo "== TensorFlow $version: tests"
# The op finds its probe beside itself and the TVM runtime from the TVM Python:
# what the environment says otherwise would hide those defaults. The SavedModel
# tests run, but not those of build/run_saved_model: `make build` links it against
# the project's TensorFlow, not this one.
unset TVMDSOOP_PROBE TVMDSOOP_LIBRARY_PATH
PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} \
TVMDSOOP_LIBRARY=$PWD/$build/libtvm_dso_op.so \
TVMDSOOP_TVM_PYTHON=$tvm_python \
  "$python" -m pytest -q \
    tests/python/test_tf_op.py tests/python/test_semantics.py tests/python/test_models.py \
    tests/python/test_properties.py tests/python/test_process.py tests/python/test_serving.py \
    tests/python/test_auto.py \
    tests/python/test_auto_convert.py \
    -k "not static_archive"
