"""The ``tvmdsoop`` command (also ``python -m tf_op``): what a TVM library is,
and whether it is the one expected, told before anyone loads it; and a saved
model compiled into a SavedModel that runs on TVM.

    tvmdsoop inspect LIB [--json]    its kind, functions, SHA-256, TVM, CPU needs
    tvmdsoop verify LIB --sha256 HEX  exit 0 when the file has that digest
    tvmdsoop compile MODEL OUT [--batch-sizes 1,8] [--signature KEY] [--target T] [--tune N]

Nothing of the library runs: ``inspect`` reads it with the op library's ELF
reader (the checks the op makes before it loads one), and ``verify`` hashes it.
``compile`` runs ``tf_op.compile`` (docs/compiler.md) on a SavedModel's
signature or a Keras file. Errors are one line on stderr: exit status 2 for a
wrong command line, 1 for a library or model that fails (missing, not a
library, another digest, a compile error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from tf_op._version import __version__

PROG = "tvmdsoop"

#: How ``inspect`` names each kind of library (dsoop's Inspection.Kind).
KIND_NAMES = {
    "functions": "functions library (functions exported to TVM-FFI)",
    "model": "Relax model (a Relax VM executable: its functions return their outputs)",
    "legacy": "legacy library (TVM 0.8-0.21, functions under their own names)",
}
#: A model of old TVM: relay.build's, one file (its graph and params embedded).
RELAY_MODEL = "relay.build model (a graph executor model of TVM 0.8-0.20: its function returns its outputs)"

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class Failure(Exception):
    """What the command reports on one line and exits 1 for: no traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line argv (by default the process's) and returns its exit
    status; argparse exits 2 by itself on a wrong command line."""
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except Failure as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect and verify TVM libraries without loading them; compile saved models with TVM.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect", help="what a library is: its kind, functions, SHA-256, TVM and CPU needs",
        description="What a TVM library is, read from its file: nothing of it runs.",
    )
    inspect.add_argument("library", metavar="LIB", help="the library's path")
    inspect.add_argument("--json", action="store_true", help="one JSON object, for programs")
    inspect.set_defaults(run=_inspect)

    verify = commands.add_parser(
        "verify", help="whether a library's file has the SHA-256 expected",
        description="Exit 0 when the library's file has the SHA-256 given, 1 otherwise.",
    )
    verify.add_argument("library", metavar="LIB", help="the library's path")
    verify.add_argument("--sha256", required=True, type=_sha256_argument, metavar="HEX",
                        help="the SHA-256 expected: 64 hex digits")
    verify.set_defaults(run=_verify)

    compile_ = commands.add_parser(
        "compile", help="a SavedModel or Keras file compiled with TVM, written as a SavedModel that runs it",
        description="Compiles MODEL (a SavedModel folder, or a .keras or .h5 file) with tf_op.compile for each "
                    "batch size and writes to OUT a SavedModel whose signature (the same name, inputs and "
                    "outputs) runs the TVM libraries, held as its assets. Where it loads it needs `import tf_op` "
                    "(or the op library linked in), not TVM.",
    )
    compile_.add_argument("model", metavar="MODEL", help="a SavedModel folder, or a .keras or .h5 file")
    compile_.add_argument("output", metavar="OUT", help="the SavedModel folder to write")
    compile_.add_argument("--batch-sizes", type=_batch_sizes_argument, default=[1], metavar="N[,N...]",
                          help="the batch sizes to compile (the inputs' first dimension; default 1)")
    compile_.add_argument("--signature", default="serving_default", metavar="KEY",
                          help="the SavedModel's signature to compile (default serving_default)")
    compile_.add_argument("--target", default=None,
                          help="portable (default: every x86-64 level, the highest the CPU has runs), native, "
                               "or a TVM target string")
    compile_.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                          help="tune with MetaSchedule, this many trials in all (needs the [tune] extra)")
    compile_.add_argument("--cache-dir", default=None, metavar="DIR",
                          help="tf_op.compile's cache (default $TVMDSOOP_CACHE_DIR or ~/.cache/tvmdsoop)")
    compile_.set_defaults(run=_compile)
    return parser


def _batch_sizes_argument(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes are positive integers separated by commas, got {text!r}")
    return sizes


def _compile(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up lines say nothing here
    from tf_op.compiler.errors import CompileError
    from tf_op.compiler.export import export

    if os.path.exists(args.output):
        raise Failure(f"{os.path.abspath(args.output)} exists: name a new folder for the SavedModel")
    try:
        compiled = export(args.model, args.output, batch_sizes=args.batch_sizes, signature_key=args.signature,
                          target=args.target, tune=args.tune, cache_dir=args.cache_dir)
    except (OSError, ValueError, CompileError) as e:
        raise Failure(str(e)) from None
    for c in compiled:
        print(f"input shapes {c.shapes}: {c.library} (sha256 {c.sha256})")
    print(f"wrote the SavedModel {os.path.abspath(args.output)}")
    return 0


def _sha256_argument(text: str) -> str:
    """A SHA-256 as given on the command line, lower-cased; a wrong one is a
    usage error (exit 2), not a mismatch."""
    text = text.strip()
    if not _SHA256.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a SHA-256 is 64 hex digits, got {text!r}")
    return text.lower()


def _inspect(args: argparse.Namespace) -> int:
    info = _inspection(args.library)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(describe(info))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tf_op.module import file_sha256

    path = _path(args.library)
    if not os.path.exists(path):
        raise Failure(f"{path} does not exist")
    if os.path.isdir(path):
        raise Failure(f"{path} is a directory, not a library file")
    try:
        digest = file_sha256(path)
    except OSError as e:
        raise Failure(f"{path}: {e.strerror or e}") from None
    if digest != args.sha256:
        raise Failure(f"{path} has SHA-256 {digest}, not the {args.sha256} expected")
    print(f"OK {path} has SHA-256 {digest}")
    return 0


def _path(library: str) -> str:
    """The library's absolute path; an empty one names no file (abspath would
    make it the current directory)."""
    if not library:
        raise Failure("the library path is empty")
    return os.path.abspath(library)


def _inspection(library: str) -> dict[str, Any]:
    """What the op library's ELF reader says of the library (``Module``'s
    checks), or the Failure that says why it is not one."""
    from tf_op.module import _check_library_file

    path = _path(library)
    try:
        return _check_library_file(path)
    except (OSError, ValueError) as e:
        raise Failure(str(e).removeprefix("tf_op: ")) from None


def describe(info: dict[str, Any]) -> str:
    """``inspect``'s text for people: one fact a line."""
    params = info.get("parameters") or {}
    functions = [f"{name}({', '.join(params[name])})" if name in params else name for name in info["functions"]]
    relay = info["kind"] == "model" and info["tvm"] == "0.8-0.20"
    lines = [
        info["path"],
        f"  kind:       {RELAY_MODEL if relay else KIND_NAMES.get(info['kind'], info['kind'])}",
        f"  functions:  {', '.join(functions) if functions else '(none)'}",
        f"  sha256:     {info['sha256']}",
        f"  size:       {info['size']} bytes",
        f"  TVM:        {_tvm_text(info['tvm'])}",
        f"  CPU:        {_cpu_text(info)}",
    ]
    for level in info.get("levels") or []:
        lines.append(f"  level:      {level['name']}, for CPUs with {' '.join(level['cpu_flags'])}")
    embedded = [m["kind"] + (f" ({m['format']})" if m.get("format") else "") for m in info.get("embedded") or []]
    lines.append(f"  embedded:   {', '.join(embedded) if embedded else '(none)'}")
    return "\n".join(lines)


def _tvm_text(tvm: str) -> str:
    if tvm == ">=0.22":
        return "TVM >= 0.22 (the TVM-FFI calling convention; libraries record no finer version)"
    return f"TVM {tvm}"


def _cpu_text(info: dict[str, Any]) -> str:
    flags = info.get("cpu_flags") or []
    if not flags:
        return "no features recorded (any CPU of its architecture)"
    missing = info.get("missing_cpu_flags") or []
    verdict = f"this CPU lacks {' '.join(missing)}" if missing else "this CPU has them"
    return f"uses {' '.join(flags)} ({verdict})"


if __name__ == "__main__":
    sys.exit(main())
