"""The compile cache: a folder of libraries by content key, so that a second
process (a server restart) loads instead of compiling.

A key hashes the traced function's fingerprint (tflite_conversion.py: its graph,
captured values, TF's version; known before the function is converted, so a hit
does not convert) with what else decides the library: the resolved target, the
tuning budget, the TVM version, the worker's source, the settings it reads
from the environment (``_COMPILE_SETTINGS``) and this module's
``FORMAT_VERSION``. Each library ``KEY.so`` has beside it the sha256 it
had when made (``KEY.so.sha256``): an entry whose library no longer matches is
compiled again. The folder also keeps the resolved host target (targets.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tf_op.compiler import worker
from tf_op.module import file_sha256

if TYPE_CHECKING:  # targets keeps its answers here: imported for the type only
    from tf_op.compiler.progress import Progress
    from tf_op.compiler.targets import Target

logger = logging.getLogger(__package__)

#: Part of every cache key: raise it when what a cache entry holds, or how this
#: package makes it, changes, so that old entries are not reused (the worker's own
#: source is part of the key already: ``worker.digest``).
FORMAT_VERSION = 7  # 7: tf_op.compile unrolls loops of few steps (unroll.unrolled)

#: What TVM's thread pool reads from the environment: how many threads run a
#: parallel loop, how long idle ones spin before sleeping, whether they are
#: pinned (docs/compiler.md); the worker's ``TUNING_THREAD_SETTINGS``.
_TVM_THREAD_SETTINGS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS")

#: What the worker reads from the environment that changes the library it
#: makes, and each one's default (tf_op_tvm/winograd.py: ``0`` keeps 3x3
#: convolutions direct). A setting at its default is not in the key: unset and
#: set to the default make the same library.
_COMPILE_SETTINGS = {"TVMDSOOP_WINOGRAD": "1"}


def folder(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache folder: ``cache_dir``, else ``$TVMDSOOP_CACHE_DIR``, else ``~/.cache/tvmdsoop``."""
    chosen = cache_dir or os.environ.get("TVMDSOOP_CACHE_DIR") or Path.home() / ".cache" / "tvmdsoop"
    return Path(chosen).expanduser()


def key(fingerprint: str, target: Target, trials: int, tvm_version: str) -> str:
    """The entry of a function (its ``tflite_conversion.fingerprint``) compiled
    for ``target`` with ``trials`` tuning trials by ``tvm_version``."""
    # A tuned compile keeps whichever of the tuned and the untuned library ran
    # faster with the worker's TVM thread settings, which it inherits from here,
    # on this machine's CPUs and those this process may run on (the worker's
    # TVM thread count when unset).
    threads: dict[str, str] = {}
    if trials:
        threads = {"cpus": str(os.cpu_count()), "affinity": str(len(os.sched_getaffinity(0))),
                   **{name: os.environ.get(name, "") for name in _TVM_THREAD_SETTINGS}}
    settings = {name: os.environ[name] for name, default in _COMPILE_SETTINGS.items()
                if os.environ.get(name, default) != default}
    header = json.dumps({"format": FORMAT_VERSION, "model": fingerprint, "target": target, "trials": trials,
                         "tvm": tvm_version, "tvm_threads": threads, "settings": settings, "worker": worker.digest()},
                        sort_keys=True)
    return hashlib.sha256(header.encode()).hexdigest()


def library(fingerprint: str, tflite: Callable[[], bytes], target: Target, trials: int, python: str,
            tvm_version: str, cache_dir: Path, progress: Progress) -> tuple[Path, str]:
    """The library for the function of this fingerprint, resolved target and
    tuning budget, and its sha256: from the cache when its entry is whole (its
    recorded digest matches), else compiled now by the worker on ``python`` from
    the flatbuffer ``tflite()`` makes (called on a miss only: it takes seconds)."""
    entry = key(fingerprint, target, trials, tvm_version)
    lib_path, digest_path = cache_dir / f"{entry}.so", cache_dir / f"{entry}.so.sha256"
    with _exclusive(cache_dir / f"{entry}.lock"):
        if lib_path.is_file() and digest_path.is_file():
            recorded = digest_path.read_text().strip()
            if file_sha256(lib_path) == recorded:
                logger.info("cache hit for %s: %s", progress.name, lib_path)
                return lib_path, recorded
            logger.warning("cache entry %s does not match its recorded sha256: rebuilding it", lib_path)
        else:
            logger.info("cache miss for %s: converting it to TFLite and compiling %s", progress.name, lib_path)
        digest = worker.compile_into(tflite, target, trials, python, lib_path, progress)
        write_atomically(digest_path, digest.encode() + b"\n")
    return lib_path, digest


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``lock_path`` (made if missing): processes that
    compile the same entry at once take turns, so the second finds the first's
    library instead of replacing it (TVM's output is not byte-for-byte
    reproducible, and a library must stay the one its digest file names)."""
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomically(path: Path, data: bytes) -> None:
    """Writes ``path`` whole or not at all: a reader never sees half of it."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
