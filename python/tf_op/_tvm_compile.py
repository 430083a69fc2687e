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

The library records the x86 extensions its target lets the code use, as Linux's
/proc/cpuinfo names them, in a string ``tvmdsoop_cpu_flags``: dsoop refuses it on
a CPU without one of them (dsoop/cpuflags.go) instead of letting it die of an
illegal instruction.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
import tempfile
from pathlib import Path
from typing import Any

#: LLVM's names of the x86 instruction set extensions a library's code may use,
#: and the flags /proc/cpuinfo lists for them. Other LLVM features (tuning hints,
#: the x86-64 baseline) are not instructions a CPU can lack.
X86_FLAGS: dict[str, str] = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a",
    "popcnt": "popcnt", "lzcnt": "abm", "movbe": "movbe", "aes": "aes", "pclmul": "pclmulqdq",
    "avx": "avx", "avx2": "avx2", "fma": "fma", "fma4": "fma4", "xop": "xop", "f16c": "f16c",
    "bmi": "bmi1", "bmi2": "bmi2", "adx": "adx", "sha": "sha_ni", "gfni": "gfni", "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq", "avxvnni": "avx_vnni",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}


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
    tvm_target = tvm.target.Target(target)
    executable = tvm.compile(mod, target=tvm_target)
    compiled = time.perf_counter()
    flags = cpu_flags(tvm_target)
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp, "tvmdsoop_cpu_flags.c")
        record.write_text(_CPU_FLAGS_SOURCE.format(flags=" ".join(flags)))
        executable.export_library(str(out_path), addons=[str(record)])
    print(json.dumps({"import_s": imported - start, "compile_s": compiled - imported,
                      "export_s": time.perf_counter() - compiled, "cpu_flags": flags}))


#: The record, compiled into the library by export_library (as C++: the
#: declaration gives the constant external linkage, which C++ denies a const).
_CPU_FLAGS_SOURCE = """#ifdef __cplusplus
extern "C" {{
#endif
extern const char tvmdsoop_cpu_flags[];
__attribute__((visibility("default"))) const char tvmdsoop_cpu_flags[] = "{flags}";
#ifdef __cplusplus
}}
#endif
"""


def cpu_flags(target: Any) -> list[str]:
    """The /proc/cpuinfo flags of the x86 extensions ``target`` lets LLVM use:
    those of its ``mcpu`` and ``mattr``; none for other architectures."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    if target.kind.name != "llvm" or not triple.startswith(("x86_64", "i686", "i386")):
        return []
    return sorted({X86_FLAGS[f] for f in codegen.llvm_get_cpu_features(target) if f in X86_FLAGS})


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
