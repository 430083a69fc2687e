"""Where the TVM runtime libraries of this Python environment are.

Imports neither TensorFlow nor TVM, so that the build can run it as a script
(``python tvm_paths.py`` prints the search path) and the op library can use it
before TensorFlow loads the op.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: Package folders holding shared libraries the op library may open: tvm_ffi's
#: libtvm_ffi.so; tvm's libtvm_runtime.so and libtvm_runtime_cuda.so; and the
#: CUDA runtime libtvm_runtime_cuda.so links (nvidia-cuda-runtime).
_LIBRARY_FOLDERS = [("tvm_ffi", "lib"), ("tvm", "lib"), ("nvidia", "cu13/lib")]


def tvm_library_path() -> str:
    """The folders of the installed packages' libraries, joined by ``os.pathsep``.

    Found without importing the packages: `import tvm` would bring TVM's
    compiler, and its LLVM, into the TensorFlow process.
    """
    folders = []
    for package, sub in _LIBRARY_FOLDERS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            folder = Path(list(spec.submodule_search_locations)[0]) / sub
            if folder.is_dir():
                folders.append(str(folder))
    return os.pathsep.join(folders)


if __name__ == "__main__":
    print(tvm_library_path())
