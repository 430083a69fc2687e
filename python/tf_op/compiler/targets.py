"""TVM targets: the default and the host target, their kinds, where their
libraries run, and ``"native"`` resolved to this machine's CPU."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

from tf_op.compiler import cache, worker
from tf_op.compiler.errors import CompileError

logger = logging.getLogger(__package__)

#: Portable x86-64, and fast: one library holding the model built for each
#: x86-64 level (baseline SSE2, v3 with AVX2 and FMA, v4 with AVX-512), of which
#: the op loads the highest the CPU has (``compile_model.X86_LEVELS``). Plain
#: ``llvm`` would use the build machine's extensions, and fail on a CPU without them.
PORTABLE_TARGET = "portable"

#: ``tf_op.compile``'s target when none is given and it does not tune.
DEFAULT_TARGET = PORTABLE_TARGET

#: The target that names this machine's CPU (resolved by the TVM worker, from
#: LLVM's name for the CPU less the extensions /proc/cpuinfo does not list):
#: AVX2 and FMA where the CPU has them. The default when tuning, which
#: measures on this machine anyway.
HOST_TARGET = "native"

Target = str | dict[str, Any]


def kind(target: Target) -> str:
    """The TVM target kind of a kind name, a tag or a dict: ``nvidia/...`` tags
    are CUDA, TVM's other tags name CPUs."""
    if target in (HOST_TARGET, PORTABLE_TARGET):
        return "llvm"
    name = str(target.get("kind") or target.get("tag") or "" if isinstance(target, dict) else target)
    return "cuda" if name.startswith("nvidia/") else "llvm" if "/" in name else name


def device(target: Target) -> str | None:
    """Where a library compiled for ``target`` runs: a CUDA library on the
    first GPU (its kernels and the VM's memory are there; this overrides a
    ``tf.device`` around the call), a CPU one where TF places it."""
    return "/GPU:0" if kind(target) == "cuda" else None


def resolved(target: Target, python: str, tvm_version: str, cache_dir: Path) -> Target:
    """``target`` as the cache key and the worker take it: ``HOST_TARGET``
    named by ``python``'s TVM, any other as it is."""
    if target != HOST_TARGET:
        return target
    return dict(host_target(python, tvm_version, cache_dir))  # a copy: the cached one stays


@functools.lru_cache(maxsize=None)
def host_target(python: str, tvm_version: str, cache_dir: Path) -> dict[str, Any]:
    """``HOST_TARGET`` resolved by ``python``'s TVM: the cache key needs the
    CPU's name, and only TVM's LLVM knows it. Starting TVM for it takes seconds,
    so the answer is kept in ``cache_dir`` (which exists) under what it depends on
    (the TVM, the CPU's model and the flags /proc/cpuinfo lists) for the next process."""
    cpu = cpu_identity()
    identity = json.dumps({"format": cache.FORMAT_VERSION, "python": python, "tvm": tvm_version, "cpu": cpu},
                          sort_keys=True)
    kept = cache_dir / f"host-target-{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
    if cpu:  # without /proc/cpuinfo nothing says the CPU is the same one
        try:
            target = json.loads(kept.read_text())
            if _is_host_target(target):
                return target
            logger.warning("%s is not a CPU target: resolving %r again", kept, HOST_TARGET)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, RecursionError) as err:
            logger.warning("%s is unreadable (%s): resolving %r again", kept, err, HOST_TARGET)
    result = subprocess.run([python, str(worker.script()), "--host-target"], capture_output=True, text=True)
    try:
        if result.returncode != 0:
            raise ValueError(f"exit {result.returncode}")
        target = json.loads(result.stdout.strip().splitlines()[-1])
        if not _is_host_target(target):
            raise ValueError(f"not a CPU target: {target!r}")
    except (IndexError, ValueError) as err:
        raise CompileError(f"tf_op.compile: {python} could not name this machine's CPU ({err}): "
                           f"{worker.tail(result.stderr)}") from err
    if cpu:
        cache.write_atomically(kept, json.dumps(target).encode())
    return target


def cpu_identity() -> str:
    """The first CPU's model name and flags in /proc/cpuinfo; empty where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    wanted = ("model name", "flags")
    return "\n".join(next((line for line in lines if line.startswith(w)), "") for w in wanted).strip()


def _is_host_target(target: Any) -> bool:
    """What the worker's --host-target prints: an llvm target of a CPU name and a
    list of the extensions it turns off (``-avx2``), nothing else."""
    if not isinstance(target, dict) or set(target) - {"kind", "mcpu", "mattr"} or target.get("kind") != "llvm":
        return False
    mcpu, mattr = target.get("mcpu"), target.get("mattr", [])
    return (isinstance(mcpu, str) and _LLVM_NAME.fullmatch(mcpu) is not None and isinstance(mattr, list)
            and all(isinstance(f, str) and f.startswith("-") and _LLVM_NAME.fullmatch(f[1:]) for f in mattr))


#: An LLVM CPU or feature name (znver3, avx512vl, sse4.2, x86-64).
_LLVM_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
