#!/usr/bin/env bash
# Builds the op library (and the probe beside it) against one TensorFlow minor
# version, in a venv and build folder of its own:
#
#   packaging/tf_build.sh VERSION [CMAKE_ARG...]   (2.18, 2.19, 2.20 or 2.21)
#
# The venv .venv-tfVERSION is made once from requirements/tf-VERSION.txt; the
# build folder is build-tfVERSION, or $TVMDSOOP_BUILD_DIR. tests/tf_matrix.sh
# runs the core tests on what it builds; packaging/build_wheel.py builds in folders of
# its own (its libraries find TensorFlow from inside the installed package).
set -euo pipefail

usage() {
  echo "usage: $0 VERSION [CMAKE_ARG...]   (a TensorFlow minor version with a requirements/tf-VERSION.txt:" \
    "$(cd "$(dirname "$0")/../requirements" && ls tf-*.txt | sed 's/^tf-//; s/\.txt$//' | paste -sd ' '))" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
version=$1
shift

cd "$(dirname "$0")/.."  # the repository root
[[ -f requirements/tf-$version.txt ]] || usage

venv=.venv-tf$version
build=${TVMDSOOP_BUILD_DIR:-build-tf$version}
python=$PWD/$venv/bin/python

echo "== TensorFlow $version: $venv"
if [[ ! -x $python ]]; then
  python3 -m venv "$venv"
fi
"$python" -m pip install --quiet --disable-pip-version-check -r "requirements/tf-$version.txt"

echo "== TensorFlow $version: $build"
cmake -S . -B "$build" -G Ninja -DPython3_EXECUTABLE="$python" "$@"
cmake --build "$build" --target tvm_dso_op tvmdsoop-probe tvmdsoop_eager_entry
