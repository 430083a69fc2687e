#!/usr/bin/env bash
# Rebuilds the legacy-ABI test libraries (tests/legacy/fixtures/) with TVM 0.18,
# the TVM of JavaCPP's presets on Maven Central, and writes their SHA256SUMS.
# The tests use the committed libraries and never run this: nothing of Maven is
# needed by them, or by CI.
#
#   tests/legacy/build_fixtures.sh [CACHE_DIR]      (default build/legacy-tvm)
#
# Needs mvn, unzip, and the .venv's Python (3.11: TVM 0.18's Python package has
# only pure-Python parts besides its libraries) or $PYTHON; installs Debian's
# ocl-icd-libopencl1 and libopenblas0 (TVM 0.18's libtvm.so links them) when the
# dynamic loader does not find them and this runs as root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=$(mkdir -p "${1:-$repo/build/legacy-tvm}" && cd "${1:-$repo/build/legacy-tvm}" && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
out=$here/fixtures

# group:artifact:version:packaging:classifier, each unzipped into $cache/<artifact>.
artifacts=(
  org.bytedeco:tvm:0.18.0-1.5.11:jar:linux-x86_64
  org.bytedeco:llvm:19.1.3-1.5.11:jar:linux-x86_64
  org.bytedeco:dnnl:2.7.1-1.5.8:jar:linux-x86_64
)
for coords in "${artifacts[@]}"; do
  IFS=: read -r group artifact version packaging classifier <<<"$coords"
  dir=$cache/$artifact
  [ -f "$dir/.unzipped" ] && continue
  mvn -q dependency:get -Dmaven.repo.local="$cache/m2" -Dartifact="$coords"
  jar=$cache/m2/${group//.//}/$artifact/$version/$artifact-$version-$classifier.$packaging
  rm -rf "$dir" && mkdir -p "$dir"
  unzip -q "$jar" -d "$dir"
  touch "$dir/.unzipped"
done

for lib in libOpenCL.so.1 libopenblas.so.0; do
  if ! ldconfig -p | grep -q "$lib"; then
    if [ "$(id -u)" != 0 ]; then
      echo "TVM 0.18 needs $lib: apt-get install ocl-icd-libopencl1 libopenblas0" >&2
      exit 1
    fi
    apt-get update -q && apt-get install -y -q ocl-icd-libopencl1 libopenblas0
    break
  fi
done

tvm=$cache/tvm/org/bytedeco/tvm/linux-x86_64
export LD_LIBRARY_PATH=$cache/llvm/org/bytedeco/llvm/linux-x86_64:$cache/dnnl/org/bytedeco/dnnl/linux-x86_64
export PYTHONPATH=$tvm/python
export TVM_LIBRARY_PATH=$tvm/python/tvm
mkdir -p "$out"
"$python" "$here/fixtures.py" "$out"
(cd "$out" && sha256sum ./*.so ./*.json ./*.params ./*.out* | sed 's| \./| |' >SHA256SUMS)
cat "$out/SHA256SUMS"
