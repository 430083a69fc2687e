"""The TVM half of ``tf_op.compile``: a TFLite flatbuffer in, a Relax VM library out.

    python compile_model.py --version
    python compile_model.py --host-target
    python compile_model.py MODEL.tflite OUT.so TARGET_JSON [TUNING_TRIALS [TUNING_DIR]]
    python compile_model.py --serve

Runs in its own process on the Python that has apache-tvm (``TVMDSOOP_TVM_PYTHON``),
never in the TensorFlow process: TVM's compiler and TensorFlow each bring an LLVM,
and they clash in one process. It imports nothing of tf_op, so any Python with TVM
and the ``tflite`` reader can run it by path, as tf_op does: that Python may be
another environment's, without tvmdsoop installed. Run by path, this file's folder
is the first entry of ``sys.path``, and it imports its sibling modules from there
by their own names; imported as ``tf_op_tvm.compile_model``, through the package.

``--version`` prints the installed apache-tvm version without importing TVM (the
cache key needs it before a compile is known to be necessary); ``--host-target``
prints this machine's CPU as a target's JSON (``target="native"``). A compile writes
OUT.so and exits 0; a model the frontend or the compiler cannot take exits 2 with
the reason on stderr (the parent shows its tail). Lines on stderr that start with
``tvmdsoop:`` say what stage the compile is at (the parent logs them as they come:
tuning takes minutes); the last line on stdout is the compile's figures as JSON.

With TUNING_TRIALS > 0, MetaSchedule tunes the model's kernels first (that many
candidates measured on this machine, in all), and the compile uses the fastest;
the library written is the faster of that and the untuned one, timed here.
TUNING_DIR keeps what tuning finds for later compiles (``tune``).

``--serve`` compiles one model after another, as tf_op does (tf_op/compiler/
worker.py): each line of stdin is the arguments of a compile as a JSON list, and
the compile's output ends with a line ``tvmdsoop-done: STATUS`` (its exit status
run alone); it ends at the end of stdin. Each compile after the first is spared
the start: importing TVM and its TFLite reader takes seconds.

The library records the x86 extensions its target lets the code use, as Linux's
/proc/cpuinfo names them, in a string ``tvmdsoop_cpu_flags``: dsoop refuses it on
a CPU without one of them (dsoop/cpuflags.go) instead of letting it die of an
illegal instruction.

On a CPU the model's Relax functions are compiled to native code too
(``exec_mode="compiled"``; ``compile_relax``), not left as bytecode for TVM's
interpreter: a model of many small kernels spends much of its call between
them (the LSTM classifier 1.6x, the small CNN 1.1x). That code indexes the
VM's registers and constants by numbers the verifier cannot read back, so the
library records the digest of its serialized modules in
``tvmdsoop_library_bin_sha256``, and dsoop runs it only when they match
(dsoop/bindigest.go).

The target ``"portable"`` (tf_op.compile's default) builds the model once for
each of ``X86_LEVELS``: OUT.so is the baseline library, and carries each higher
level's whole library in a data symbol ``tvmdsoop_level_<level>`` (each with its
own flags record). dsoop loads the highest level the CPU has (dsoop/levels.go),
so one file is safe on any x86-64 CPU and uses AVX2 or AVX-512 where there is one.
On a machine with two CPUs or more, a model of ``LEVELS_APART_OPERATIONS`` or
more has its higher levels built at the same time as the baseline, each by a
process of its own (``level_processes``): three levels cost about one and a half
levels' time instead of three (ResNet50 19.5 -> 12.3 s on 2 CPUs).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import tempfile
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

if __package__:
    from tf_op_tvm import (batch_split, cpu_schedule, expansion_fusion, layer_norms, level_processes, math_lowering,
                           scaled_products, split_slices, stacked_products, weight_layouts, winograd)
    from tf_op_tvm.cpu_schedule.fallback import schedule_blocks
else:  # run by path (never through the package: another tf_op_tvm may come first on this Python's path)
    import batch_split
    import cpu_schedule
    import expansion_fusion
    import layer_norms
    import level_processes
    import math_lowering
    import scaled_products
    import split_slices
    import stacked_products
    import weight_layouts
    import winograd
    from cpu_schedule.fallback import schedule_blocks

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


#: The x86-64 microarchitecture levels (as LLVM names them) a portable library
#: holds, lowest first: any x86-64 CPU runs the first (SSE2); v3 adds AVX2, FMA
#: and BMI (Haswell, Zen 1 and later); v4 AVX-512 (Skylake-SP, Zen 4 and later).
X86_LEVELS = ("x86-64", "x86-64-v3", "x86-64-v4")

#: The target of a library that holds one build per level of ``X86_LEVELS``.
PORTABLE = "portable"

#: What a compile imports that takes seconds to: a process about to compile
#: imports these before its first request.
COMPILER_MODULES = ("tvm", "tvm.relax", "tvm.relax.frontend.tflite", "tflite")


def tvm_version() -> str:
    """The apache-tvm distribution's version, read from its metadata only."""
    return importlib.metadata.version("apache-tvm")


#: Starts the line of a failure the user can act on: the parent puts it first.
ERROR_PREFIX = "tvmdsoop-error: "

#: Ends a served compile's output, before its exit status (``serve``).
DONE_PREFIX = "tvmdsoop-done: "


def progress(message: str) -> None:
    """One stage's line, in one write: the processes of a portable compile's
    levels write theirs to the same pipe."""
    sys.stderr.write(f"tvmdsoop: {message}\n")
    sys.stderr.flush()


def _patch_flatten_to_nd() -> None:
    """TVM 0.27's TFLite frontend reads the shape of BATCH_MATMUL's operands
    from ``x.ty``, which a broadcast it has just made does not have yet: a
    matmul by a rank-2 operand that is not a constant (a weight fed as an input,
    as tf_op.auto's clusters feed Keras kernels) failed to import with
    "'Type' object has no attribute 'shape'". The shape is read from the
    normalised expression instead."""
    from tvm import relax
    from tvm.relax.frontend.tflite import tflite_frontend

    def flatten_to_nd(self: Any, x: Any, nd: int = 3) -> Any:
        shape = self.bb.normalize(x).ty.shape
        ndims = len(shape)
        if ndims == nd:
            return x
        return relax.op.reshape(x, [-1] + [int(shape[i]) for i in range(ndims - nd + 1, ndims)])

    tflite_frontend.OperatorConverter.flatten_to_nd = flatten_to_nd


class FrontendOpError(Exception):
    """TVM's TFLite frontend failed on one op: which, and what it computes."""


def _name_failing_ops() -> None:
    """Makes the frontend's failure on an op name the op (its TFLite code) and
    the tensor it computes, whose name is the user's TF op's: TVM's own
    messages ("ScatterND op requires ...", "emit_te now only supports ...")
    name neither."""
    from tvm.relax.frontend.tflite import tflite_frontend

    converter = tflite_frontend.OperatorConverter
    if getattr(converter, "_tvmdsoop_names_ops", False):
        return
    original_init = converter.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        for code, convert in list(self.convert_map.items()):
            self.convert_map[code] = _naming(self, code, convert)

    converter.__init__ = init
    converter._tvmdsoop_names_ops = True


def _naming(converter: Any, code: str, convert: Any) -> Any:
    def named(op: Any) -> Any:
        try:
            # Normalised here as the frontend does next: its shape checks fail there.
            ret = convert(op=op)
            return None if ret is None else converter.bb.normalize(ret)
        except Exception as err:
            tensors = [t.tensor.Name().decode() for t in converter.get_output_tensors(op)]
            computes = f"computing {tensors[0].split(';')[0]!r}" if tensors else "with no output"
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise FrontendOpError(f"TVM's TFLite frontend cannot take the op {code} {computes}: "
                                  f"{type(err).__name__}: {reason}") from err
    return named


def import_tflite(flatbuffer: bytes) -> Any:
    """The TFLite model as a Relax module, the layout changes TFLite puts on
    weights that are inputs undone (``weight_layouts``), each part of a split
    a slice that fuses into where it is used (``split_slices``), products of
    one matrix by slices of one tensor one product (``stacked_products``)."""
    import tflite
    from tvm.relax.frontend.tflite import from_tflite

    _patch_flatten_to_nd()
    _name_failing_ops()
    mod = from_tflite(tflite.Model.GetRootAsModel(flatbuffer, 0))
    return stacked_products.stack_sliced_products(split_slices.split_to_slices(weight_layouts.simplify(mod)))


class NoLinkerError(Exception):
    """No C++ compiler to link the library with."""


def ensure_linker(work_dir: Path) -> None:
    """Gives export_library a C++ compiler to link with: the one TVM finds
    ($CXX, $CC, g++, clang++, cc ... on PATH), else the Zig toolchain's
    (``python -m ziglang c++``, which tvmdsoop's compile extra brings, for
    machines with no compiler), through a script in ``work_dir`` named to TVM
    as $CXX."""
    from tvm.support import cc

    if cc.get_cc() is not None:
        return
    if importlib.util.find_spec("ziglang") is None:
        raise NoLinkerError("TVM links the compiled library with a C++ compiler, and none is on PATH (g++, clang++, "
                            "cc or $CXX): install one, or tvmdsoop's [compile] extra, which brings ziglang's")
    script = work_dir / "zig-c++"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ziglang c++ "$@"\n')
    script.chmod(0o755)
    os.environ["CXX"] = str(script)
    progress("no C++ compiler on PATH: linking with ziglang's")


def compile_tflite(tflite_path: Path, out_path: Path, target: dict[str, object] | str, trials: int = 0,
                   tuning_dir: Path | None = None) -> None:
    """from_tflite -> (tuning) -> tvm.compile -> export_library, once per level
    for ``PORTABLE``. The frontend turns every TFLite weight into a constant, so
    the library's ``main`` takes only the inputs."""
    start = time.perf_counter()
    ensure_linker(out_path.parent)
    if target == PORTABLE and trials > 0:
        raise ValueError("tuning measures this machine's CPU: tune for one target, not the portable levels")
    mod = import_model(tflite_path, target, progress)
    imported = time.perf_counter()
    progress(f"imported the TFLite model into Relax in {imported - start:.2f} s")
    figures: dict[str, Any] = {"import_s": imported - start, "tune_s": 0.0, "trials": trials, "compile_s": 0.0}

    def build_level(level: dict[str, object] | str) -> tuple[Any, Any]:
        executable, tvm_target, level_figures = build(mod, level, trials, tuning_dir)
        for name in ("tune_s", "compile_s"):
            figures[name] += level_figures.pop(name)
        figures.update(level_figures)
        return executable, tvm_target

    # A small model's levels take less time to build than a process of their own takes to start.
    apart = partial(build_level_library, tflite_path.resolve()) if operations(mod) >= LEVELS_APART_OPERATIONS else None
    levels = export_levels(build_level, out_path, target, apart)
    figures["compile_s"] += levels.pop("compile_s")
    figures.update(levels)
    if levels["levels"]:
        progress(f"built for {', '.join(X86_LEVELS)}: dsoop loads the highest this CPU has")
    print(json.dumps(figures))


#: How many operations a model has before a portable compile builds its higher
#: levels in processes of their own (``export_levels``): each process's start,
#: and its first build's, cost about a second of CPU, which a small model's
#: levels do not repay (the small CNN, 10 operations, 2.2 -> 2.9 s; MobileNetV2,
#: 153, 15.3 -> 8.7 s on 2 CPUs).
LEVELS_APART_OPERATIONS = 48


def operations(mod: Any) -> int:
    """How many operations the model's ``main`` computes (its bindings)."""
    return sum(len(block.bindings) for block in mod["main"].body.blocks)


def import_model(tflite_path: Path, target: dict[str, object] | str, report: Callable[[str], None]) -> Any:
    """The model of ``tflite_path`` as Relax, its batch split for a CPU (``batch_split``)."""
    mod = import_tflite(tflite_path.read_bytes())
    return batch_split.split_batch(mod, report) if _is_cpu(target) else mod


def build_level_library(tflite_path: Path, level: dict[str, object], out_path: Path) -> dict[str, float]:
    """A portable compile's higher ``level``, in a process of its own
    (``level_processes.LevelProcess``): the model imported again from its TFLite file, built for
    ``level`` and exported to ``out_path``. Returns the seconds compiling and
    exporting."""
    executable, tvm_target, figures = build(import_model(tflite_path, level, lambda _: None), level, 0)
    exporting = time.perf_counter()
    export_recorded(executable, tvm_target, out_path, out_path.parent)
    return {"compile_s": figures["compile_s"], "export_s": time.perf_counter() - exporting}


def _is_cpu(target: dict[str, object] | str) -> bool:
    import tvm

    return target == PORTABLE or tvm.target.Target(target).kind.name == "llvm"


def export_levels(build_level: Callable[[Any], tuple[Any, Any]], out_path: Path, target: dict[str, object] | str,
                  build_apart: Callable[[dict[str, object], Path], dict[str, float]] | None = None) -> dict[str, Any]:
    """Builds (``build_level(level)``: something with ``export_library``, and the
    TVM target it was built for) and exports the library at ``out_path`` for
    ``target``: for ``PORTABLE``, once per level of ``X86_LEVELS``, the first
    carrying the others (``levels_source``), each recording the CPU features it
    uses. With ``build_apart`` (a function that pickles: it builds a level and
    exports it to the path it is given, and returns its figures) and two
    processes or more (``level_processes.level_processes``: this one and N - 1
    others), the highest levels are built by ``build_apart`` each in a process
    of its own while this one builds the rest, the first last.

    Returns the first level's CPU flags (``cpu_flags``), the higher levels'
    names (``levels``), how many processes of their own built them
    (``level_processes``), the seconds spent exporting (``export_s``) and those
    the other processes spent compiling (``compile_s``), summed over the levels."""
    levels = [{"kind": "llvm", "mcpu": level} for level in X86_LEVELS] if target == PORTABLE else [target]
    figures: dict[str, Any] = {"levels": [target_name(level) for level in levels[1:]], "export_s": 0.0,
                               "compile_s": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        # Each level above the first: its library, embedded in the first's.
        higher = {target_name(level): Path(tmp, f"{target_name(level)}.so") for level in levels[1:]}
        apart = min(level_processes.level_processes(len(levels)) - 1, len(levels) - 1) if build_apart else 0
        with contextlib.ExitStack() as processes:
            # The server preloads this file's modules by their own names, as the worker, run by path, has them.
            server = level_processes.start_level_server([*COMPILER_MODULES, Path(__file__).stem]) if apart else None
            started = [processes.enter_context(level_processes.LevelProcess(
                server, build_apart, level, target_name(level), higher[target_name(level)], tmp))
                for level in levels[len(levels) - apart:]]
            for level in reversed(levels[1:len(levels) - apart]):
                built, tvm_target = build_level(level)
                exporting = time.perf_counter()
                export_recorded(built, tvm_target, higher[target_name(level)], Path(tmp))
                figures["export_s"] += time.perf_counter() - exporting
            built, tvm_target = build_level(levels[0])
            for process in started:
                for name, seconds in process.result().items():
                    figures[name] += seconds
            figures["level_processes"] = len(started)
        exporting = time.perf_counter()
        addons = []
        if higher:
            embedded = Path(tmp, "tvmdsoop_levels.S")
            embedded.write_text(levels_source(higher))
            addons.append(str(embedded))
        figures["cpu_flags"] = export_recorded(built, tvm_target, out_path, Path(tmp), addons)
        figures["export_s"] += time.perf_counter() - exporting
    return figures


def build(mod: Any, target: dict[str, object] | str, trials: int,
          tuning_dir: Path | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """``mod`` compiled for ``target`` (tuned first with ``trials``, ``tune``), the TVM
    target it was compiled for, and the figures: seconds tuning and compiling,
    and, tuned, both libraries' timings."""
    import tvm

    tvm_target = tvm.target.Target(target)
    if tvm_target.kind.name == "llvm":
        math_lowering.register()
    untuned = mod
    start = time.perf_counter()
    if trials > 0:
        mod, tvm_target = tune(mod, target, trials, tuning_dir)
    pipeline = cpu_pipeline(tvm_target) if tvm_target.kind.name == "llvm" else "default"
    tuned = time.perf_counter()
    executable = compile_relax(mod, tvm_target, pipeline)
    progress(f"compiled for {target_name(target)} in {time.perf_counter() - tuned:.2f} s")
    timings: dict[str, Any] = {}
    if trials > 0 and tvm_target.kind.name == "llvm":  # timed on this machine's CPU
        executable, timings = faster_of(executable, compile_relax(untuned, tvm_target, pipeline),
                                        untuned["main"])
    return executable, tvm_target, {"tune_s": tuned - start, "compile_s": time.perf_counter() - tuned, **timings}


def compile_relax(mod: Any, target: Any, pipeline: Any) -> Any:
    """``tvm.compile`` of ``mod``, with its Relax functions compiled to native code
    where ``native_relax_functions`` says so."""
    from tvm import relax

    return relax.build(mod, target=target, relax_pipeline=pipeline,
                       exec_mode="compiled" if native_relax_functions(target) else "bytecode")


def native_relax_functions(target: Any) -> bool:
    """Whether a library for ``target`` runs its Relax functions as native code:
    on a CPU. Not on CUDA, where the code that calls the kernels runs on the
    host: that path has not been run on a GPU yet."""
    return bool(target.kind.name == "llvm")


def export_recorded(built: Any, target: Any, path: Path, work_dir: Path, addons: Sequence[str] = ()) -> list[str]:
    """``built.export_library(path)`` (with ``addons``), and in it the records
    dsoop reads before it loads the library: the CPU flags of the extensions
    ``target`` lets its code use and, for a Relax VM executable whose functions
    are native code, the digest of its serialized modules (``library_bin_sha256``).
    Returns the flags."""
    from tvm import relax

    flags = cpu_flags(target)
    records = {"tvmdsoop_cpu_flags": " ".join(flags)}
    if isinstance(built, relax.VMExecutable) and native_relax_functions(target):
        records["tvmdsoop_library_bin_sha256"] = library_bin_sha256(built)
    source = work_dir / f"tvmdsoop_records_{path.stem}.c"
    source.write_text(records_source(records))
    built.export_library(str(path), addons=[str(source), *addons])
    return flags


def library_bin_sha256(built: Any) -> str:
    """The SHA-256 of the modules ``built.export_library`` serializes into the
    library, byte for byte its ``__tvm_ffi__library_bin``: the same
    serialization (TVM's PackImports), as bytes rather than as code."""
    import tvm

    blob = tvm.get_global_func("runtime.ModulePackImportsToTensor")(built.mod)
    return hashlib.sha256(blob.numpy().tobytes()).hexdigest()


def target_name(target: dict[str, object] | str) -> str:
    """How the log names a target: its CPU for an llvm one, else its kind or tag."""
    if isinstance(target, dict):
        return str(target.get("mcpu") or target.get("kind") or target.get("tag"))
    return target


def levels_source(libraries: dict[str, Path]) -> str:
    """Assembly that embeds each level's library (by name) whole, in a data
    symbol ``tvmdsoop_level_<name>`` of its own, where dsoop reads it (ELF symbols
    of the file) before loading anything."""
    parts = ['    .section .rodata.tvmdsoop_levels,"a",@progbits']
    for name, path in libraries.items():
        symbol = "tvmdsoop_level_" + name.replace("-", "_")
        quoted = str(path).replace("\\", "\\\\").replace('"', '\\"')
        parts += [f"    .globl {symbol}", f"    .type {symbol}, @object", "    .balign 64", f"{symbol}:",
                  f'    .incbin "{quoted}"', f"    .size {symbol}, . - {symbol}"]
    parts.append('    .section .note.GNU-stack,"",@progbits')  # no executable stack
    return "\n".join(parts) + "\n"


def tune(mod: Any, target_json: dict[str, object] | str, trials: int,
         database_dir: Path | None = None) -> tuple[Any, Any]:
    """``mod`` with the kernels MetaSchedule found fastest in ``trials`` measured
    candidates, shared out evenly among its tuning tasks (TVM's
    static_shape_tuning pipeline, with the build step below), and the target it
    was tuned for, which the compile must use too.

    With ``database_dir``, what tuning finds is kept there (MetaSchedule JSON
    databases, a folder per TVM version, target and thread settings:
    ``tuning_folder``; under a lock), and a kernel that an earlier compile
    tuned for this target and thread settings (the same workload: shapes,
    dtypes, fused epilogue) takes its record from there and no trials: the
    model's other kernels share them all."""
    check_tuning_works()  # first: it names the fix for a missing module, psutil among them
    # Candidates are timed with the thread settings the op library gives TVM
    # beside TF (dsoop.c, default_tvm_thread_settings) where the user set none:
    # the kernels kept must be the fastest there, not under TVM's own defaults.
    for name, value in zip(TUNING_THREAD_SETTINGS, (str(len(os.sched_getaffinity(0))), "200", "0"), strict=True):
        os.environ.setdefault(name, value)
    import psutil
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    if not isinstance(target_json, dict):  # a kind or a tag: its full form
        target_json = dict(tvm.target.Target(target_json).export())
    if target_json.get("kind") == "llvm" and "num-cores" not in target_json:
        # MetaSchedule sizes parallel loops by it, and insists on it.
        target_json = {**target_json, "num-cores": psutil.cpu_count(logical=False) or 1}
    target = tvm.target.Target(target_json)
    start = time.perf_counter()
    mod = kernels_to_tune(mod, target)
    tasks = ms.relax_integration.extract_tasks(mod, target)

    def has_record(task: Any) -> bool:
        return chosen.query_tuning_record(task.dispatched[0], target, task.task_name) is not None

    kept_in = None if database_dir is None else tuning_folder(database_dir, target)
    with tuning_database(kept_in) as (database, chosen):
        new = [task for task in tasks if not has_record(task)]
        if len(new) < len(tasks):
            progress(f"{len(tasks) - len(new)} of {len(tasks)} kernels were tuned before "
                     f"(in {kept_in}): their schedules are reused")
        if new:
            # Winograd's transforms keep their default schedule unsearched: they
            # move memory, and MetaSchedule's candidates of one (inlined whole,
            # unrolled at random) took minutes each to build.
            searched = [task for task in new if not cpu_schedule.winograd.is_transform(task.dispatched[0]["main"])]
            if searched and measure(searched, trials, database, start) == 0:
                raise RuntimeError(f"tuning found no working candidate for any of the {len(searched)} kernels "
                                   "(MetaSchedule's log above says why)")
            times = choose_schedules(new, target, database, chosen)
            # Kernels whose default did not run are said so (choose_schedules) and not counted here.
            compared = {task: pair for task, pair in times.items() if math.isfinite(pair[0])}
            won = sum(searched_secs < default_secs for default_secs, searched_secs in compared.values())
            default_us = sum(task.weight * default_secs for task, (default_secs, _) in compared.items()) * 1e6
            kept_us = sum(task.weight * min(pair) for task, pair in compared.items()) * 1e6
            progress(f"MetaSchedule's kernels ran faster than the default schedules' for {won} of "
                     f"{len(compared)} kernels, timed again in turns, the others keep the default schedule: "
                     f"their calls take {kept_us:.1f} µs instead of {default_us:.1f}")
        # A kernel none of whose candidates built and ran, its default included,
        # keeps its untuned form.
        tuned = sum(has_record(task) for task in tasks)
        with target, chosen:
            mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    progress(f"tuned {tuned} of {len(tasks)} kernels in {time.perf_counter() - start:.2f} s")
    return mod, target


def kernels_to_tune(mod: Any, target: Any) -> Any:
    """``mod`` lowered to the loop nests MetaSchedule extracts its tasks from:
    the model's rewrites first, as in cpu_pipeline (the kernels they make,
    Winograd's transforms and products, one a layer norm or step, are the
    kernels tuned), TVM's ``zero`` pipeline, then which of each loop nest's
    inputs are the model's weights (as in cpu_pipeline), so that
    MetaSchedule's candidates may repack them at compile time as the default
    schedules do, and are timed without it. Only the weights a reduction reads
    (a convolution's filter, a product's matrix: those the default schedules
    repack) stay on that list: MetaSchedule's RewriteLayout repacks a weight
    by one of the ways its block reads it, and an elementwise block with its
    producers and consumers inlined reads one weight several ways (an LSTM
    step's bias at each gate's offset, which it rewrote as 64 values of 256:
    the tuned model's outputs were 19 % off Keras's)."""
    import tvm
    from tvm import relax, s_tir, tirx

    with target:
        mod = tvm.transform.Sequential([*model_rewrites(progress), relax.transform.DecomposeOpsForInference(),
                                        relax.transform.CanonicalizeBindings(),
                                        relax.get_pipeline("zero"),
                                        relax.transform.AttachAttrLayoutFreeBuffers()])(mod)
    for gvar, func in list(mod.functions.items()):
        free = func.attrs.get("layout_free_buffers") if isinstance(func, tirx.PrimFunc) and func.attrs else None
        if not free:
            continue
        sch = s_tir.Schedule(func)
        reduced = [region.source for block in sch.get_child_blocks(sch.get_sblock("root"))
                   if cpu_schedule.rule.has_reduction(stmt := sch.get(block)) for region in stmt.reads]
        kept = [int(i) for i in free if any(func.params[int(i)].same_as(buffer) for buffer in reduced)]
        if len(kept) < len(free):
            mod[gvar] = func.with_attr("layout_free_buffers", kept) if kept else func.without_attr("layout_free_buffers")
    return mod


#: Times the default schedule and the search's best candidate of a kernel are
#: each timed again, in turns, before one is chosen (``choose_schedules``).
CHOICE_ROUNDS = 7

#: Milliseconds each of those timings lasts at least (MetaSchedule's runner
#: calls the kernel as many times as that takes).
CHOICE_ROUND_MS = 20


def choose_schedules(tasks: list[Any], target: Any, database: Any, chosen: Any) -> dict[Any, tuple[float, float]]:
    """For each of ``tasks``, its default schedule (``cpu_schedule``'s, what an
    untuned compile runs) and the fastest candidate of the search in
    ``database``, built as the candidates were and timed ``CHOICE_ROUNDS``
    times in turns; the faster by the median goes into ``chosen``, the
    database the compile applies. Returns each task's seconds a call, default
    and searched (inf where there is none: a kernel not searched, or whose
    candidates all failed).

    Not the search's own timings: it times each candidate once, and its best
    is the least of tens of noisy timings of similar kernels, which the
    default's one timing rarely beats. On a noisy 2-CPU Zen 4 the
    transformer block at batch 8 had 6 of its 13 kernels "won" that way by
    8 %, and the library they made ran 1 % slower than the untuned one (its
    Q, K and V products 7 µs slower each, timed alone and in the model)."""
    from tvm.s_tir import meta_schedule as ms

    candidates: list[tuple[Any, str, Any]] = []  # (task, kind, schedule)
    for task in tasks:
        candidates.append((task, "default", cpu_schedule.default_schedule(task.dispatched[0]["main"], target)))
        searched = database.query_schedule(task.dispatched[0], target, task.task_name)
        if searched is not None:  # the search's best record, its trace replayed
            candidates.append((task, "searched", searched))
    with candidate_builder() as builder:
        built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, _, sch in candidates])
    for (task, kind, _), result in zip(candidates, built):
        if result.error_msg is not None and kind == "default":
            progress(f"the default schedule of {task.task_name} did not build, so tuning does not compare "
                     f"against it: {_last_line(result.error_msg)}")
    runnable = [(candidate, result) for candidate, result in zip(candidates, built) if result.error_msg is None]
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
        number=1, repeat=1, min_repeat_ms=CHOICE_ROUND_MS))
    args = [ms.arg_info.ArgInfo.from_entry_func(sch.mod) for (_, _, sch), _ in runnable]
    inputs = [ms.runner.RunnerInput(result.artifact_path, "cpu", arg) for (_, result), arg in zip(runnable, args)]
    samples: list[list[float]] = [[] for _ in runnable]
    failed: list[str | None] = [None] * len(runnable)
    for round_ in range(CHOICE_ROUNDS):
        # Each round in the other order (a kernel's default runs before its
        # searched candidate, then after it), and without a candidate that has
        # failed once: it is not chosen, and its timeouts would cost rounds.
        order = [i for i in range(len(runnable)) if failed[i] is None][::1 if round_ % 2 == 0 else -1]
        for i, future in zip(order, runner.run([inputs[i] for i in order])):
            run = future.result()
            if run.error_msg is not None:
                failed[i] = run.error_msg
            else:
                samples[i].extend(float(secs) for secs in run.run_secs)
    timed: dict[Any, dict[str, tuple[float, Any, list[float], Any]]] = {}  # task -> kind -> (median, ...)
    for ((task, kind, sch), _), arg, runs, error in zip(runnable, args, samples, failed):
        if error is None:
            timed.setdefault(task, {})[kind] = (statistics.median(runs), sch, runs, arg)
        elif kind == "default":
            progress(f"the default schedule of {task.task_name} did not run, so tuning does not compare "
                     f"against it: {_last_line(error)}")
    for task, kinds in timed.items():
        _, sch, runs, arg = min(kinds.values(), key=lambda timing: timing[0])
        chosen.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, chosen.commit_workload(task.dispatched[0]), runs, target, arg))
    return {task: tuple(kinds[kind][0] if kind in kinds else math.inf for kind in ("default", "searched"))
            for task, kinds in timed.items()}


def _last_line(message: str) -> str:
    """The last line of an error's text, which says what failed; or the text."""
    lines = message.strip().splitlines()
    return lines[-1] if lines else message


#: What TVM's thread pool reads from the environment: the thread count, how
#: long idle threads spin, whether they are pinned. Kernels timed under other
#: settings may rank otherwise, so tuning records are kept apart by them.
TUNING_THREAD_SETTINGS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS")


def tuning_folder(root: Path, target: Any) -> Path:
    """Where the tuning records for ``target`` (its full form, ``num-cores``
    included) under this process's TVM thread settings are kept in ``root``:
    a folder per TVM version (records of another TVM may not apply), in it one
    per target and thread settings, named ``<CPU>-<N>threads-<digest of both>``.
    Apart, because MetaSchedule's databases find a kernel's record by its
    workload alone, not by the target or threads it was timed with: one
    folder for all would hand a schedule chosen on one CPU, x86-64 level or
    thread count to a compile for another (an AVX-512 choice to an AVX2
    library, a two-thread choice to sixteen threads)."""
    described = dict(target.export())
    settings = {"target": described, "threads": {name: os.environ.get(name, "") for name in TUNING_THREAD_SETTINGS}}
    # TVM's arrays and maps as JSON's, not their printed form, which another tvm-ffi may print otherwise.
    plain = json.dumps(settings, sort_keys=True, default=lambda value: dict(value) if hasattr(value, "items") else list(value))
    digest = hashlib.sha256(plain.encode()).hexdigest()[:12]
    cpu = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(described.get("mcpu") or target.kind.name))
    return root / tvm_version() / f"{cpu}-{settings['threads']['TVM_NUM_THREADS'] or 'default'}threads-{digest}"


@contextlib.contextmanager
def tuning_database(folder: Path | None) -> Iterator[tuple[Any, Any]]:
    """MetaSchedule's databases: every candidate the searches measured, and the
    schedule chosen for each kernel (``choose_schedules``); in memory, or kept in
    ``folder`` (``tuning_folder``), the chosen ones in ``chosen/`` there, held
    under an exclusive lock while in use, so that two compiles never write
    their files at once. The lock is one for the folders of all targets and
    thread settings: two compiles tuning at once, for any targets, would
    time their candidates on the same CPUs, each slowed by the other."""
    from tvm.s_tir import meta_schedule as ms

    if folder is None:
        yield ms.database.MemoryDatabase(), ms.database.MemoryDatabase()
        return
    (folder / "chosen").mkdir(parents=True, exist_ok=True)
    with open(folder.parent / "lock", "a+b") as lock:
        if not try_lock(lock):
            progress(f"waiting for another compile's tuning to finish with {folder.parent}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield ms.database.JSONDatabase(work_dir=str(folder)), ms.database.JSONDatabase(work_dir=str(folder / "chosen"))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def try_lock(lock: Any) -> bool:
    """Takes an exclusive lock on the open file ``lock`` if no one holds it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def measure(tasks: list[Any], trials: int, database: Any, start: float) -> int | None:
    """Tunes ``tasks`` (MetaSchedule's extracted tasks) with ``trials`` measured
    candidates shared evenly among those MetaSchedule can search, into
    ``database``. Returns how many candidates built and ran; None where it can
    search none (they all keep their default schedules)."""
    from tvm.s_tir import meta_schedule as ms

    with tempfile.TemporaryDirectory(prefix="tvmdsoop-tuning-") as work_dir:
        contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir)
        searchable, refused = [], {}
        for task, context in zip(tasks, contexts, strict=True):
            reason = design_space_error(context)
            if reason is None:
                searchable.append(task)
            else:
                refused.setdefault(reason, []).append(task.task_name)
        for reason, names in refused.items():
            progress(f"MetaSchedule cannot search {len(names)} kernel{'s' * (len(names) > 1)} ({', '.join(names[:3])}"
                     f"{', ...' * (len(names) > 3)}): the design space failed with ScheduleError: {reason}; "
                     f"{'they keep their' if len(names) > 1 else 'it keeps its'} default schedule")
        if not searchable:
            return None
        return search(searchable, work_dir, trials, database, start)


def design_space_error(context: Any) -> str | None:
    """Why MetaSchedule makes no design space for a task (its ``context``), or
    None where it makes one: its rules fail on some kernels (MultiLevelTiling's
    reverse_compute_at on a product whose epilogue reads another producer, as
    an LSTM step's at batch 8 does), and their error, raised while the search
    starts, would end the whole tuning. Such a kernel is left out of the
    search and keeps its default schedule. Other errors (TVM's internal checks)
    still end the tuning: they are not a rule declining a kernel."""
    from tvm.s_tir import ScheduleError

    try:
        context.generate_design_space()
    except ScheduleError as err:
        lines = str(err).splitlines()
        said = next((line for line in lines if line.startswith("Error message:")), lines[0] if lines else "")
        return said.removeprefix("Error message:").strip()
    return None


#: Candidates of one kernel MetaSchedule measures at a time (its
#: ``num_trials_per_iter``): a kernel given more trials is searched in batches.
TRIALS_PER_BATCH = 64


def search(tasks: list[Any], work_dir: str, trials: int, database: Any, start: float) -> int:
    """MetaSchedule's search of ``tasks`` (extracted tasks it makes a design
    space for), ``trials`` candidates shared evenly among them; how many built
    and ran.

    Where each kernel gets one batch of trials (``TRIALS_PER_BATCH``), as
    ``tune=True`` gives most models, its candidates are random samples of its
    design space (MetaSchedule's ``replay-trace``), not an evolutionary
    search's: that search ranks its population of 512 by a cost model, and the
    gradient task scheduler measures every kernel's first batch before the
    model learns from any, so the ranking is the untrained model's random
    numbers, and the population cost seconds a kernel for nothing (MobileNetV2
    with 4 trials a kernel: 454 s of tuning, 165 s sampled, and the same
    choice: the default schedules). With more trials, the evolutionary search
    steers the later batches."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    per_task = max(1, -(-trials // len(tasks)))
    strategy = "replay-trace" if per_task <= TRIALS_PER_BATCH else "evolutionary"
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, strategy=strategy)
    progress(f"tuning {len(contexts)} kernels, {trials} trials in all (up to {per_task} each, "
             f"{'sampled at random' if strategy == 'replay-trace' else 'an evolutionary search'}): "
             "MetaSchedule's own log follows on stderr")

    @derived_object
    class Working(PyMeasureCallback):
        """Counts the candidates measured, and those that built and ran."""

        def __init__(self) -> None:
            self.measured = self.working = 0

        def apply(self, task_scheduler: Any, task_id: int, candidates: list[Any], builds: list[Any],
                  runs: list[Any]) -> None:
            self.measured += len(candidates)
            self.working += sum(run.error_msg is None for run in runs)

    # Progress is told as candidates are built, a batch a kernel: their timings
    # come back in one go at the end of the first round (the gradient task
    # scheduler joins no kernel's runs before every kernel has had a batch).
    sent = 0

    def built(count: int) -> None:
        nonlocal sent
        sent += count
        # The last batch may overrun the budget by a few: the count stops at it.
        progress(f"tuning: {min(sent, trials)} of {trials} trials built ({time.perf_counter() - start:.0f} s)")

    counter = Working()
    # Sampling ranks nothing: no cost model to train (XGBoost's features of every candidate) for it.
    sampled = strategy == "replay-trace"
    callbacks = ([ms.measure_callback.AddToDatabase(), ms.measure_callback.RemoveBuildArtifact()] if sampled
                 else ms.MeasureCallback.create("default"))
    with candidate_builder(built) as builder:
        ms.tune.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=trials,
            max_trials_per_task=per_task, num_trials_per_iter=min(TRIALS_PER_BATCH, per_task),
            builder=builder, database=database, cost_model="random" if sampled else "xgb",
            measure_callbacks=[*callbacks, counter])
    progress(f"tuning: {counter.working} of {counter.measured} candidates built and ran "
             f"({time.perf_counter() - start:.0f} s)")
    return counter.working


#: Largest difference, relative to each output's largest value, between the
#: tuned and the untuned library's outputs on the same inputs for the tuned
#: one to be kept: their sums may run in other orders (rounding: 1e-6 here), not compute
#: other values.
TUNED_TOLERANCE = 1e-3


def faster_of(tuned: Any, untuned: Any, main: Any) -> tuple[Any, dict[str, Any]]:
    """The faster of the tuned and the untuned executable of the Relax function
    ``main``, timed here in TVM's VM, in turns, and both medians in µs. A small
    trial budget can find kernels slower than the untuned schedule step's
    (MobileNetV2 at batch 1 with 400 trials here), and the user asked for
    speed, not for tuning. The tuned one is kept only where its outputs are the
    untuned one's within ``TUNED_TOLERANCE``, on the same random inputs: a
    MetaSchedule candidate that computes something else (its RewriteLayout
    once repacked an LSTM step's bias wrongly) must not reach the user."""
    import numpy as np
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f"
                               else np.ones(shape, dtype), dev)
            for shape, dtype in (([int(d) for d in p.ty.shape], str(p.ty.dtype)) for p in main.params)]
    vms = {"tuned": relax.VirtualMachine(tuned, dev), "untuned": relax.VirtualMachine(untuned, dev)}
    outputs = {name: _arrays(vm["main"](*args)) for name, vm in vms.items()}
    error = max((_difference(t, u) for t, u in zip(outputs["tuned"], outputs["untuned"], strict=True)), default=0.0)
    if not error <= TUNED_TOLERANCE:
        progress(f"the tuned library's outputs are {error:.3g} from the untuned's (relative to each output's largest value), "
                 f"more than {TUNED_TOLERANCE:g}: a tuned kernel computes something else, keeping the untuned "
                 "library")
        return untuned, {"tuned_error": error, "kept": "untuned"}
    timers = {name: vm.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=20) for name, vm in vms.items()}
    runs: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(5):  # in turns: a slow spell of the machine falls on both
        for name, timer in timers.items():
            runs[name] += timer(*args).results
    timings = {f"{name}_us": float(np.median(times)) * 1e6 for name, times in runs.items()}
    kept = min(timers, key=lambda name: timings[f"{name}_us"])
    progress(f"a call takes {timings['tuned_us']:.1f} µs tuned, {timings['untuned_us']:.1f} µs untuned: "
             f"keeping the {kept} library")
    return (tuned if kept == "tuned" else untuned), {**timings, "tuned_error": error, "kept": kept}


def _arrays(output: Any) -> list[Any]:
    """A VM function's result as numpy arrays: a tensor, a value (a shape's
    dimension, a scalar), or nested tuples of them."""
    import numpy as np

    if hasattr(output, "numpy"):
        return [output.numpy()]
    if isinstance(output, (int, float, bool)):
        return [np.asarray(output)]
    return [array for item in output for array in _arrays(item)]


def _difference(got: Any, want: Any) -> float:
    """The largest difference between two outputs relative to the largest
    magnitude in ``want`` (each output its own scale, so a small one is not
    hidden by a large one); infinite where their shapes differ or their NaNs
    and infinities are not in the same places."""
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    finite = np.isfinite(want)
    if not (np.isfinite(got) == finite).all() or not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = float(np.abs(want[finite]).max()) or 1.0
    return float(np.abs(got[finite] - want[finite]).max()) / scale


def model_rewrites(report: Callable[[str], None]) -> list[Any]:
    """The Relax passes that run on the model before TVM's own for a CPU
    (``cpu_pipeline``'s first, and ``tune``'s, whose kernels they make):
    Winograd's convolutions, each layer norm one function, each step of a
    recurrence one function, a reshaped product's scale its epilogue."""
    return [winograd.winograd_convolutions(report), layer_norms.fuse_layer_norms(), stacked_products.group_steps(),
            scaled_products.scale_before_reshape()]


def cpu_pipeline(target: Any) -> Any:
    """TVM's default CPU pipeline (``relax.backend.cpu_generic``, what
    ``tvm.compile`` runs for an llvm target) with steps added once the
    operators are loop nests: the default schedules of ``cpu_schedule`` on each
    that no tuning scheduled, then ``channel_innermost`` on those that none of
    them took. Before the schedules, each loop nest learns which of its
    parameters are the model's constants (``layout_free_buffers``); after them,
    the weight repacking a schedule marked (the conv rule's, for a constant
    weight) leaves its function and runs once, at compile time (FoldConstant).
    And before FuseTIR makes the loop nests, an expansion convolution and the
    stride-2 depthwise one after it become one function (``expansion_fusion``).
    First of all, 3x3 convolutions of stride 1 become Winograd's transforms
    and matrix products (``winograd``), which ``cpu_schedule`` schedules too,
    each layer normalization one function (``layer_norms``), each step of
    a recurrence that slices a stacked product one function with its own
    product (``stacked_products.group_steps``), and a reshaped product's
    scale its epilogue (``scaled_products``).

    Unscheduled, TVM runs the loop nests TOPI wrote, which put the reductions
    innermost: a convolution's innermost loop runs over 3 input channels, a
    dense layer's reads its weights a row apart for each step. With the output's
    last dimension innermost instead (the channel, contiguous in the output, in
    NHWC inputs and in the weights), LLVM vectorizes it: 2.4 to 15 times faster
    on tf_op.compile's test models here, with the same sums in the same order.

    Loop nests of ``PARALLEL_MIN_WORK`` iterations or more (elementwise ones of
    ``ELEMENTWISE_PARALLEL_MIN_WORK``) also run their outer loops on TVM's
    threads (``TVM_NUM_THREADS``; one thread runs them in turn)."""
    import tvm
    from tvm import relax, s_tir, tirx
    from tvm.relax.backend.cpu_generic import pipeline as cpu
    from tvm.s_tir import dlight

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.ChannelInnermost")
    def channel_innermost_pass(mod: Any, _ctx: Any) -> Any:
        reductions = scheduled = parallel = 0
        for gvar, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc):
                continue
            # MetaSchedule's kernels and cpu_schedule's carry their own schedule: only counted.
            fresh = not (func.attrs and func.attrs.get("tirx.is_scheduled"))
            sch = s_tir.Schedule(func)
            blocks = sch.get_child_blocks(sch.get_sblock("root"))
            if fresh:
                found, took = schedule_blocks(sch)
                reductions, scheduled = reductions + found, scheduled + took
                mod[gvar] = sch.mod["main"]
            parallel += sum(any(sch.get(loop).kind == tirx.ForKind.PARALLEL for loop in sch.get_loops(block))
                            for block in blocks)
        progress(f"scheduled {scheduled} of {reductions} reductions with the output channel innermost; "
                 f"{parallel} loop nests run on TVM's threads")
        return mod

    # FuseOps makes a function of each convolution and its epilogue; two of them
    # become one before FuseTIR makes loop nests of them (expansion_fusion).
    legalize = cpu.legalize_passes(target)
    fuse_tir = [p.info.name for p in legalize].index("FuseTIR")

    @tvm.transform.module_pass(opt_level=0, name="tvmdsoop.UntunedCPUPipeline")
    def pipeline(mod: Any, _ctx: Any) -> Any:
        with target:
            return tvm.transform.Sequential([
                *model_rewrites(progress), *cpu.library_dispatch_passes(target),
                *legalize[:fuse_tir], expansion_fusion.fuse_expansions(
                    target, cpu_schedule.expansion.ExpansionDepthwise.for_target(target), progress),
                *legalize[fuse_tir:],
                relax.transform.AttachAttrLayoutFreeBuffers(),
                dlight.ApplyDefaultSchedule(*cpu_schedule.rules(target)), channel_innermost_pass,
                relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
                *cpu.dataflow_lower_passes(target), *cpu.finalize_passes(target)])(mod)

    return pipeline


#: What MetaSchedule imports only when it tunes (tf_op's ``tune`` extra).
TUNING_MODULES = {"psutil": "psutil", "cloudpickle": "cloudpickle", "xgboost": "xgboost-cpu"}


def check_tuning_works() -> None:
    """Fails with the fix when tuning cannot run here, before minutes are spent:
    a missing module, or a TVM-FFI whose JSON serialisation (which MetaSchedule
    sends every candidate through) crashes on this TVM's objects, as
    apache-tvm-ffi 0.1.15 does with apache-tvm 0.27 (checked in a child
    process, since the failure is a segfault)."""
    import importlib.util

    missing = [dist for module, dist in TUNING_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise RuntimeError(f"tuning needs {', '.join(missing)} in {sys.executable}: "
                           "pip install 'tvmdsoop[tune]' there")
    probe = "import tvm; tvm.ir.save_json(tvm.tirx.IntImm('int32', 1))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"tuning cannot run with apache-tvm {tvm_version()} and apache-tvm-ffi "
            f"{importlib.metadata.version('apache-tvm-ffi')} in {sys.executable}: TVM's JSON "
            f"serialisation fails (exit {result.returncode}); install the apache-tvm-ffi this "
            "TVM was built with (apache-tvm 0.27: apache-tvm-ffi==0.1.14.post0)")


#: ``math_lowering`` as this module imported it: its name, and the folder that
#: has to be on the path for that name to import.
_MATH_LOWERING = (math_lowering.__name__,
                  str(Path(math_lowering.__file__).resolve().parents[math_lowering.__name__.count(".")]))


#: Batches of candidates one set of builder processes builds before fresh
#: ones replace it (``candidate_builder``).
BUILDER_BATCHES_PER_POOL = 16

#: Seconds a candidate may take to build, as MetaSchedule's LocalBuilder allows.
BUILD_TIMEOUT_S = 30.0


@contextlib.contextmanager
def candidate_builder(built: Callable[[int], None] = lambda count: None) -> Iterator[Any]:
    """A MetaSchedule builder of candidates (``build_candidate``, one process
    a CPU) that keeps its processes for ``BUILDER_BATCHES_PER_POOL`` batches,
    and shuts the last ones down on exit; it calls ``built`` with the size of
    each batch it has built. MetaSchedule's LocalBuilder starts new processes
    for every batch (its workers leak memory with use), and each imports TVM
    first, 1.4 s here, with a batch a kernel: EfficientNetB0's 61 kernels
    (256 trials) tuned in 196 s on kept processes, 289 s on fresh ones.
    Every 16 batches bounds the leak."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    state: dict[str, Any] = {"pool": None, "batches": 0}

    def pool() -> Any:
        if state["pool"] is None or state["batches"] == BUILDER_BATCHES_PER_POOL:
            if state["pool"] is not None:
                state["pool"].shutdown()
            state["pool"] = PopenPoolExecutor(max_workers=len(os.sched_getaffinity(0)), timeout=BUILD_TIMEOUT_S)
            state["batches"] = 0
        state["batches"] += 1
        return state["pool"]

    @derived_object
    class PooledBuilder(PyBuilder):
        """LocalBuilder's build (its worker function, its messages) on kept processes."""

        def build(self, build_inputs: list[Any]) -> list[Any]:
            results = []
            for result in pool().map_with_error_catching(
                    lambda x: _worker_func(*x),
                    [(build_candidate, None, one.mod, one.target, None) for one in build_inputs]):
                if result.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(result.value, None))
                elif result.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {BUILD_TIMEOUT_S} seconds"))
                else:
                    results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{result.value}"))
            built(len(results))
            return results

    try:
        yield PooledBuilder()
    finally:
        if state["pool"] is not None:
            state["pool"].shutdown()


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default build of one candidate kernel, less its import of
    ``tvm.s_tir.tensor_intrin``: that import takes about 30 s, and a builder pays
    it in every process it starts (MetaSchedule's, for every batch of
    candidates; ``candidate_builder``, every 16 batches). Candidates reach the
    builder already scheduled (tensorized too), so the build needs no intrinsic.

    The candidates' exp, log, erf, sigmoid and tanh lower as the compile lowers
    them (``math_lowering``): the builder's processes are fresh ones, where
    unregistered, a softmax's exponentials were libm's, one at a time (the
    transformer block's softmax timed 726 µs instead of 96)."""
    name, folder = _MATH_LOWERING
    if folder not in sys.path:
        sys.path.append(folder)
    importlib.import_module(name).register()
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


#: One record: a string constant dsoop reads from the library's symbols.
_RECORD = 'extern const char {name}[];\n__attribute__((visibility("default"))) const char {name}[] = "{value}";\n'


def records_source(records: dict[str, str]) -> str:
    """The records, as C++ for export_library to compile into the library: the
    declaration gives each constant external linkage, which C++ denies a const."""
    body = "".join(_RECORD.format(name=name, value=value) for name, value in records.items())
    return f'#ifdef __cplusplus\nextern "C" {{\n#endif\n{body}#ifdef __cplusplus\n}}\n#endif\n'


def cpu_flags(target: Any) -> list[str]:
    """The /proc/cpuinfo flags of the x86 extensions ``target`` lets LLVM use:
    those of its ``mcpu`` and ``mattr``; none for other architectures."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    if target.kind.name != "llvm" or not triple.startswith(("x86_64", "i686", "i386")):
        return []
    return sorted({X86_FLAGS[f] for f in codegen.llvm_get_cpu_features(target) if f in X86_FLAGS})


def host_target() -> dict[str, Any]:
    """This machine's CPU as an llvm target: LLVM's name for it, less any x86
    extension of that CPU model that /proc/cpuinfo does not list (a virtual
    machine can hide some), so that the library never uses one this CPU lacks."""
    import tvm
    from tvm.target import codegen

    target: dict[str, Any] = {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}
    have = proc_cpu_flags()
    missing = sorted(f for f in codegen.llvm_get_cpu_features(tvm.target.Target(target))
                     if f in X86_FLAGS and have is not None and X86_FLAGS[f] not in have)
    return {**target, "mattr": [f"-{f}" for f in missing]} if missing else target


def proc_cpu_flags() -> set[str] | None:
    """The flags /proc/cpuinfo lists for the first CPU; None where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    return set(line.partition(":")[2].split()) if line else None


def serve() -> int:
    """Compiles each request of stdin (``--serve``), ending each one's output with
    its status. Both streams are flushed first: the parent reads them as one
    pipe, and the status line closes what the compile wrote."""
    # Its parent ends it (the end of stdin, or a kill when a compile is
    # interrupted): a Ctrl-C at the terminal, which reaches the whole process
    # group, must not end it between compiles.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before the first request: tf_op starts the worker ahead of it, to import
    # TVM while it converts the model (worker._Server.start_ahead). A module
    # that is missing fails the first compile instead, which names it.
    with contextlib.suppress(ImportError):
        for module in COMPILER_MODULES:
            importlib.import_module(module)
    while line := sys.stdin.readline():
        try:
            arguments = json.loads(line)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, list) or not all(isinstance(a, str) for a in arguments):
            print(f"not a compile's arguments (a JSON list of strings): {line.strip()[:200]!r}", file=sys.stderr)
            status = 64
        else:
            # Each compile in the environment the worker started with, as a
            # process of its own would be (ensure_linker sets $CXX to a script
            # in the compile's folder, which goes with it).
            environment = dict(os.environ)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                status = compile_main(arguments)
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                os.environ.clear()
                os.environ.update(environment)
            gc.collect()  # the compile's modules, before the worker waits for the next
        sys.stderr.flush()
        ctypes.CDLL(None).fflush(None)  # what C code wrote to stdio, before the line that ends it
        # On a line of its own, whether or not what the compile wrote ended one.
        print(f"\n{DONE_PREFIX}{status}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(tvm_version())
        return 0
    if argv == ["--host-target"]:
        print(json.dumps(host_target()))
        return 0
    if argv == ["--serve"]:
        return serve()
    return compile_main(argv)


def compile_main(argv: list[str]) -> int:
    """A compile's arguments run: 0, 2 for a model TVM cannot take (the reason on
    stderr), 64 for arguments that are not a compile's."""
    if len(argv) not in (3, 4, 5) or (len(argv) >= 4 and not argv[3].isdigit()):
        print(__doc__, file=sys.stderr)
        return 64
    try:
        compile_tflite(Path(argv[0]), Path(argv[1]), json.loads(argv[2]), int(argv[3]) if len(argv) >= 4 else 0,
                       Path(argv[4]) if len(argv) == 5 else None)
    except Exception as err:  # noqa: BLE001  (every failure is reported to the parent the same way)
        import traceback

        traceback.print_exc()
        print(f"tvm compile failed: {type(err).__name__}: {err}", file=sys.stderr)
        if isinstance(err, FrontendOpError | NoLinkerError) or type(err).__name__ == "OpNotImplemented":
            # The line the parent puts first in its error (tf_op/compiler/worker.py).
            print(f"{ERROR_PREFIX}{str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
