"""Finds and loads the op library, once per process."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from types import ModuleType

import tensorflow as tf

LIBRARY_NAME = "libtvm_dso_op.so"
#: Names the op library to load instead of the one found next to the package.
LIBRARY_ENV = "TVMDSOOP_LIBRARY"
#: Folders holding libtvm_ffi.so and libtvm_runtime.so (read by the op library).
TVM_LIBRARY_PATH_ENV = "TVM_LIBRARY_PATH"

_lock = threading.Lock()
_ops: ModuleType | None = None


def library_path() -> Path:
    """The op library this package loads.

    In order: ``$TVMDSOOP_LIBRARY``; the copy installed in the package; the
    ``build/`` folder of the source tree the package sits in (an editable install).
    """
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent
    candidates = [here / LIBRARY_NAME, here.parent.parent / "build" / LIBRARY_NAME]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"tf_op: the op library {LIBRARY_NAME} was not found in "
        + " or ".join(str(c.parent) for c in candidates)
        + f"; build it with `make build` or set {LIBRARY_ENV}"
    )


def tvm_library_path() -> str:
    """The folders of the installed tvm_ffi and tvm packages' shared libraries.

    Found without importing either package: `import tvm` would bring TVM's
    compiler, and its LLVM, into the TensorFlow process.
    """
    folders = []
    for package in ("tvm_ffi", "tvm"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            folder = Path(list(spec.submodule_search_locations)[0]) / "lib"
            if folder.is_dir():
                folders.append(str(folder))
    return os.pathsep.join(folders)


def load() -> ModuleType:
    """Loads the op library (once) and returns its generated op wrappers."""
    global _ops
    with _lock:
        if _ops is None:
            if not os.environ.get(TVM_LIBRARY_PATH_ENV):
                os.environ[TVM_LIBRARY_PATH_ENV] = tvm_library_path()
            _ops = tf.load_op_library(str(library_path()))
        return _ops
