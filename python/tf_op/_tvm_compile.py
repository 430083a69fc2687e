"""The TVM half of ``tf_op.compile``: a TFLite flatbuffer in, a Relax VM library out.

    python _tvm_compile.py --version
    python _tvm_compile.py MODEL.tflite OUT.so TARGET_JSON

Runs in its own process on the Python that has apache-tvm (``TVMDSOOP_TVM_PYTHON``),
never in the TensorFlow process: TVM's compiler and TensorFlow each bring an LLVM,
and they clash in one process. It imports nothing of tf_op, so any Python with TVM
and the ``tflite`` reader can run it by path.

``--version`` prints the installed apache-tvm version without importing TVM (the
cache key needs it before a compile is known to be necessary). A compile writes
OUT.so and exits 0; a model the frontend or the compiler cannot take exits 2 with
the reason on stderr (the parent shows its tail).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from pathlib import Path


def tvm_version() -> str:
    """The apache-tvm distribution's version, read from its metadata only."""
    return importlib.metadata.version("apache-tvm")


def compile_tflite(tflite_path: Path, out_path: Path, target: dict[str, object]) -> None:
    """from_tflite -> tvm.compile -> export_library. The frontend turns every TFLite
    weight into a constant, so the library's ``main`` takes only the inputs."""
    import tflite
    import tvm
    from tvm.relax.frontend.tflite import from_tflite

    start = time.perf_counter()
    model = tflite.Model.GetRootAsModel(tflite_path.read_bytes(), 0)
    mod = from_tflite(model)
    imported = time.perf_counter()
    executable = tvm.compile(mod, target=tvm.target.Target(target))
    compiled = time.perf_counter()
    executable.export_library(str(out_path))
    print(json.dumps({"import_s": imported - start, "compile_s": compiled - imported,
                      "export_s": time.perf_counter() - compiled}))


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(tvm_version())
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 64
    try:
        compile_tflite(Path(argv[0]), Path(argv[1]), json.loads(argv[2]))
    except Exception as err:  # noqa: BLE001  (every failure is reported to the parent the same way)
        import traceback

        traceback.print_exc()
        print(f"tvm compile failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
