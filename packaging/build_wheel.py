"""The binary wheel: the tf_op package with the op library built for each
supported TensorFlow, for users with no Go, CMake or compiler (docs/install.md).

    python packaging/build_wheel.py [--versions 2.18,2.19,2.20,2.21] [--out dist]

Each TensorFlow minor version's op library is built by packaging/tf_build.sh in
a folder of its own (build-wheel-tfVERSION), then checked as auditwheel checks a
manylinux wheel: it may link only the C and C++ runtimes every Linux with a
TensorFlow wheel has, and TensorFlow's own framework library, at symbol versions
no newer than the wheel's platform tag promises. The package picks the library
of the running TensorFlow at import (tf_op/_library.py), from
``tf_op/_ops/tfVERSION/``, where the probe lies beside it (dsoop looks there).

Only the standard library: this runs with any Python 3.11+.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("2.18", "2.19", "2.20", "2.21")
#: glibc 2.35 and GCC 12's libstdc++ (Ubuntu 22.04, Debian 12 and later): what
#: the toolchain here links against. TensorFlow's own wheels ask for less
#: (manylinux_2_27); an older system refuses this wheel at install, not at import.
PLATFORM = "manylinux_2_35_x86_64"
#: The newest symbol version of each library the platform guarantees (auditwheel's
#: policy for manylinux_2_35).
MAX_SYMBOL_VERSIONS = {"GLIBC": (2, 35), "GLIBCXX": (3, 4, 30), "CXXABI": (1, 3, 13), "GCC": (12, 0, 0)}
#: What the op library may link: the C and C++ runtimes (as manylinux allows) and
#: TensorFlow's framework library, which TensorFlow has loaded before any op library.
ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
                  "libstdc++.so.6", "ld-linux-x86-64.so.2", "libtensorflow_framework.so.2"}
#: The op library sits in site-packages/tf_op/_ops/tfVERSION/, TensorFlow in site-packages/tensorflow/.
RPATH = "$ORIGIN/../../../tensorflow"
PACKAGES = ("tf_op", "tf_op_tvm")
#: The eager entry is a CPython extension of the stable ABI (cmd/eager_entry/eager_entry.c):
#: the wheel is for CPython 3.10 and later, any of them.
SHIPPED = ("libtvm_dso_op.so", "tvmdsoop_build.json", "tvmdsoop-probe", "_eager_entry.abi3.so")
TAG = f"cp310-abi3-{PLATFORM}"


class AuditError(Exception):
    """A library of the wheel links what its users may lack."""


def build(version: str) -> Path:
    """The op library for TensorFlow ``version``, built; its build folder."""
    folder = ROOT / f"build-wheel-tf{version}"
    subprocess.run([str(ROOT / "packaging" / "tf_build.sh"), version, f"-DTVMDSOOP_RPATH={RPATH}",
                    "-DTVMDSOOP_TESTS=OFF"], check=True, env={**os.environ, "TVMDSOOP_BUILD_DIR": str(folder)})
    return folder


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "--wide", *args], check=True, capture_output=True, text=True).stdout


def audit(library: Path, limits: dict[str, tuple[int, ...]] = MAX_SYMBOL_VERSIONS) -> None:
    """Refuses a library that links more than ALLOWED_NEEDED, needs a symbol
    version newer than ``limits``, or names a folder of this machine."""
    dynamic = _readelf("--dynamic", str(library))
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    problems = [f"links {name}, which is not part of every system with TensorFlow"
                for name in sorted(needed - ALLOWED_NEEDED)]
    for path in re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[([^\]]+)\]", dynamic):
        problems += [f"its rpath names {p}, a folder of the build machine"
                     for p in path.split(":") if not p.startswith("$ORIGIN")]
    versions = set(re.findall(r"\b(GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\b", _readelf("--version-info", str(library))))
    for name, version in sorted(versions):
        number = tuple(int(part) for part in version.split("."))
        if number > limits[name]:
            limit = ".".join(map(str, limits[name]))
            problems.append(f"needs {name}_{version}, newer than {PLATFORM} promises ({name}_{limit})")
    if problems:
        raise AuditError(f"{library}: " + "; ".join(problems))


def _package_files() -> Iterator[tuple[str, Path]]:
    """The Python packages' files, by their path in the wheel."""
    for package in PACKAGES:
        for path in sorted((ROOT / "python" / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".so"}:
                yield path.relative_to(ROOT / "python").as_posix(), path


def _stripped(library: Path, into: Path) -> Path:
    """A copy of ``library`` without its debug sections (a third of the size;
    Go's own tables for its panics and backtraces stay)."""
    out = into / library.name
    subprocess.run(["objcopy", "--strip-debug", str(library), str(out)], check=True)
    return out


def _metadata(project: dict, version: str) -> str:
    lines = ["Metadata-Version: 2.4", f"Name: {project['name']}", f"Version: {version}",
             f"Summary: {project['description']}", f"License-Expression: {project['license']}",
             f"Requires-Python: {project['requires-python']}"]
    lines += [f"License-File: {f}" for f in project.get("license-files", [])]
    lines += [f"Requires-Dist: {d}" for d in project["dependencies"]]
    for extra, requirements in project["optional-dependencies"].items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in requirements]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (ROOT / project["readme"]).read_text()


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def assemble(builds: dict[str, Path], out_dir: Path) -> Path:
    """Writes the wheel of the packages and the op libraries of ``builds`` (by
    TensorFlow version), each audited first; returns its path."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    version = re.search(r'__version__\s*=\s*"([^"]+)"', (ROOT / "python/tf_op/_version.py").read_text()).group(1)
    dist_info = f"{project['name']}-{version}.dist-info"
    tag = TAG
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel_path = out_dir / f"{project['name']}-{version}-{tag}.whl"
    staging = out_dir / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()

    entries: list[tuple[str, bytes, int]] = [(name, path.read_bytes(), 0o644) for name, path in _package_files()]
    for tf_version, folder in sorted(builds.items()):
        for name in SHIPPED:
            source = folder / name
            if name.endswith(".so"):  # the op library and the eager entry
                audit(source)
                source = _stripped(source, staging)
            entries.append((f"tf_op/_ops/tf{tf_version}/{name}", source.read_bytes(),
                            0o755 if name == "tvmdsoop-probe" else 0o644))
    for license_file in project.get("license-files", []):
        # Under their paths in the project (PEP 639): two are named LICENSE.
        entries.append((f"{dist_info}/licenses/{license_file}", (ROOT / license_file).read_bytes(), 0o644))
    entries.append((f"{dist_info}/METADATA", _metadata(project, version).encode(), 0o644))
    entries.append((f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: tvmdsoop packaging/build_wheel.py\n"
                                           f"Root-Is-Purelib: false\nTag: {tag}\n").encode(), 0o644))
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    entries.append((f"{dist_info}/entry_points.txt", f"[console_scripts]\n{scripts}".encode(), 0o644))

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data, _ in entries:
        writer.writerow(_record_line(name, data))
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode(), 0o644))

    with zipfile.ZipFile(wheel_path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    shutil.rmtree(staging)
    return wheel_path


def main(argv: Iterable[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default=",".join(VERSIONS),
                        help="the TensorFlow minor versions to build for, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "dist"), help="the folder the wheel goes to")
    args = parser.parse_args(list(argv))
    versions = [v for v in args.versions.split(",") if v]
    unknown = sorted(set(versions) - set(VERSIONS))
    if unknown:
        parser.error(f"no TensorFlow {', '.join(unknown)} here; supported: {', '.join(VERSIONS)}")
    try:
        wheel = assemble({v: build(v) for v in versions}, Path(args.out))
    except AuditError as e:
        print(f"packaging/build_wheel.py: {e}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
