"""Finds and loads the op library, once per process."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
from pathlib import Path
from types import ModuleType

import tensorflow as tf

from .tvm_paths import tvm_library_path

LIBRARY_NAME = "libtvm_dso_op.so"
#: Written beside the op library by its build: the TensorFlow it was built for.
BUILD_INFO_NAME = "tvmdsoop_build.json"
#: Names the op library to load instead of the one found next to the package.
LIBRARY_ENV = "TVMDSOOP_LIBRARY"
#: Folders holding the TVM runtime libraries (read by the op library).
LIBRARY_PATH_ENV = "TVMDSOOP_LIBRARY_PATH"

_lock = threading.Lock()
_ops: ModuleType | None = None
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


#: The binary wheel's folder of op libraries, one tfMAJOR.MINOR/ per TensorFlow
#: it was built for (packaging/build_wheel.py).
WHEEL_LIBRARIES = "_ops"


class UnsupportedTensorFlowError(ImportError):
    """The binary wheel holds no op library for the running TensorFlow."""


def library_path() -> Path:
    """The op library this package loads.

    In order: ``$TVMDSOOP_LIBRARY``; the binary wheel's library for the running
    TensorFlow's minor version; the copy ``pip install .`` built into the
    package; the ``build/`` folder of the source tree the package sits in (an
    editable install).
    """
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent
    if (here / WHEEL_LIBRARIES).is_dir():
        return wheel_library(here / WHEEL_LIBRARIES, tf.__version__)
    candidates = [here / LIBRARY_NAME, here.parent.parent / "build" / LIBRARY_NAME]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"tf_op: the op library {LIBRARY_NAME} was not found in "
        + " or ".join(str(c.parent) for c in candidates)
        + "; install the package (the binary wheel, or `pip install .` from its source: docs/install.md), "
        + f"run `make build` in a checkout, or set {LIBRARY_ENV}"
    )


def wheel_library(folder: Path, running: str) -> Path:
    """The op library of the binary wheel's ``folder`` for TensorFlow ``running``."""
    built = sorted((d.name.removeprefix("tf") for d in folder.glob("tf*") if (d / LIBRARY_NAME).is_file()),
                   key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    minor = ".".join(_minor(running))
    if minor not in built:
        held = f"the op library for TensorFlow {', '.join(built)}" if built else "no op library"
        raise UnsupportedTensorFlowError(
            f"tf_op: this tvmdsoop wheel holds {held} ({folder}), and TensorFlow {running} is running: "
            "install a TensorFlow it was built for, or build tvmdsoop from its source against this one "
            "(`pip install .` in a checkout, docs/install.md)"
        )
    return folder / f"tf{minor}" / LIBRARY_NAME


class BuildMismatchError(ImportError):
    """The op library was built for another TensorFlow than the one running."""


def _minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def check_build(library: Path, running: str) -> None:
    """Refuses an op library built for another TensorFlow minor version than
    ``running``, before TensorFlow loads it: TF's C++ API changes between minor
    versions, and loading would fail on an undefined, mangled symbol (or worse).

    A library with no build record beside it (one named by ``$TVMDSOOP_LIBRARY``
    and built by other means) is not checked."""
    try:
        info = json.loads((library.parent / BUILD_INFO_NAME).read_text())
    except FileNotFoundError:
        return
    built = str(info.get("tensorflow", "unknown"))
    if _minor(built) != _minor(running):
        raise BuildMismatchError(
            f"tf_op: the op library {library} was built for TensorFlow {built}, but TensorFlow "
            f"{running} is running. The op is compiled against TensorFlow's C++ API, which "
            "changes between minor versions: rebuild it in this environment with "
            "`pip install --force-reinstall --no-deps --no-cache-dir <tvmdsoop source>` "
            "(or `make build` in a checkout)."
        )


def load() -> ModuleType:
    """Loads the op library (once) and returns its generated op wrappers."""
    global _ops
    if _ops is not None:  # every op call asks: no lock once loaded
        return _ops
    with _lock:
        if _ops is None:
            if not os.environ.get(LIBRARY_PATH_ENV):
                os.environ[LIBRARY_PATH_ENV] = tvm_library_path()
            library = library_path()
            check_build(library, tf.__version__)
            _ops = tf.load_op_library(str(library))
        return _ops


@functools.lru_cache(maxsize=None)
def c_function(name: str, argtypes: tuple[type, ...], restype: type | None) -> ctypes._CFuncPtr:
    """The op library's exported C function ``name``, reached through ctypes:
    dlopen of the path TF loaded gives TF's copy back, not a second one, so
    one Go runtime serves both."""
    load()
    fn = getattr(ctypes.CDLL(str(library_path())), name)
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn


def take_string(raw: int | None) -> str:
    """The text of a malloc'ed C string the op library returned, freed."""
    try:
        return ctypes.string_at(raw).decode() if raw else ""
    finally:
        _libc.free(raw)


def take_bytes(raw: int, size: int) -> bytes:
    """The ``size`` bytes of a malloc'ed buffer the op library returned, freed."""
    try:
        return ctypes.string_at(raw, size)
    finally:
        _libc.free(raw)


def describe(lib_path: str, sha256: str = "") -> dict[str, object]:
    """What the op library sees in a TVM library: ``{"model": bool, "functions":
    [...]}`` (a model's functions, or the library's exported ones), or
    ``{"error": "..."}`` when it cannot load it.

    The op library loads the library as the op would (the same checks, and the
    copy the op then shares), and only a file of ``sha256`` when one is given."""
    describe_c = c_function("TVMDSOOpDescribeLibrary", (ctypes.c_char_p, ctypes.c_char_p), ctypes.c_void_p)
    return json.loads(take_string(describe_c(os.fsencode(lib_path), sha256.encode())))


def inspect(lib_path: str) -> dict[str, object]:
    """What a TVM library's file says about itself, read without loading it (Go's
    ELF reader: nothing of the file runs, so any file may be inspected, a
    library for another CPU included): ``{"kind": "functions" | "model" |
    "legacy", "functions": [...], "sha256": ..., "tvm": ..., "cpu_flags": [...],
    ...}`` (dsoop.Inspection), or ``{"error": "...", "not_found": bool}`` for a
    file that is not a library this process could load."""
    inspect_c = c_function("TVMDSOOpInspectLibrary", (ctypes.c_char_p,), ctypes.c_void_p)
    return json.loads(take_string(inspect_c(os.fsencode(lib_path))))


def probe(lib_path: str) -> str | None:
    """Tries the library at ``lib_path`` in the op library's probe process
    (tvmdsoop-probe, a process of its own), without loading it here, and
    returns the SHA-256 of the bytes probed; raises ``ValueError`` naming the
    library when the probe died of it (a library that would take this process
    down when loaded) or refused it. None for a library outside
    ``TVMDSOOP_ALLOWED_DIRS``, which is not probed: the op refuses it when it
    runs (``tf.errors.PermissionDeniedError``)."""
    probe_c = c_function("TVMDSOOpProbeLibrary", (ctypes.c_char_p,), ctypes.c_void_p)
    result = json.loads(take_string(probe_c(os.fsencode(lib_path))))
    if result.get("not_allowed"):
        return None
    if "error" in result:
        raise ValueError(f"tf_op: {result['error'].removeprefix('dsoop: ')}")
    return str(result["sha256"])
