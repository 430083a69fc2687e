"""``tf_op.compile``: TVM as a compiler for TensorFlow functions and Keras models.

    fast = tf_op.compile(model, input_signature=[tf.TensorSpec([None, 28, 28, 1])])
    y = fast(x)        # a TVMDSOOp running the TVM-compiled model; eager or in tf.function

The route (DESIGN.md section 9): the function is traced for a fully static input
shape, TF's TFLite converter freezes it into a flatbuffer (in this process), and a
child process on the TVM Python (``TVMDSOOP_TVM_PYTHON``, default this Python) runs
``_tvm_compile.py``: ``relax.frontend.tflite`` -> ``tvm.compile`` ->
``export_library``. TVM's compiler never loads here: its LLVM clashes with TF's.

Each static input shape is compiled once and kept in a content-addressed cache
folder, so a second process (a server restart) loads instead of compiling.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tf_op.module import Func, Module, file_sha256

logger = logging.getLogger("tf_op.bridge")

#: Portable x86-64: no instruction a baseline x86-64 CPU lacks (plain ``llvm``
#: would tune for, and use the extensions of, the build machine's CPU).
DEFAULT_TARGET: dict[str, str] = {"kind": "llvm", "mcpu": "x86-64"}

#: The target that names this machine's CPU (resolved by the TVM worker, from
#: LLVM's name for the CPU less the extensions /proc/cpuinfo does not list):
#: AVX2 and FMA where the CPU has them. The default when tuning, which
#: measures on this machine anyway.
HOST_TARGET = "native"

#: Part of every cache key: raise it when what a cache entry holds, or how this
#: module makes it, changes, so that old entries are not reused (the worker's own
#: source is part of the key already: ``_worker_digest``).
FORMAT_VERSION = 5

#: The trials ``tune=True`` gives MetaSchedule, shared among the model's kernels:
#: a few minutes on a small model, a quarter of an hour or more on MobileNetV2.
DEFAULT_TUNING_TRIALS = 1000

#: What TVM's thread pool reads from the environment: how many threads run a
#: parallel loop, and how long idle ones spin before sleeping (docs/bridge.md).
_TVM_THREAD_SETTINGS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")

#: How many lines of the worker's stderr a CompileError shows.
_STDERR_TAIL_LINES = 40

_WORKER = Path(__file__).with_name("_tvm_compile.py")

Target = str | dict[str, Any]


class CompileError(RuntimeError):
    """TF's TFLite converter or TVM could not compile the function; the message
    holds their reason (the unsupported ops, the worker's stderr tail)."""


@dataclass(frozen=True)
class _Compiled:
    """One static input shape's library, the op that runs it, and how to pack
    its flat outputs into the original function's structure."""

    lib_path: Path
    func: Func
    structure: Any


Shapes = tuple[tuple[int, ...], ...]


@dataclass
class _State:
    """What CompiledFunction keeps out of TF's tracking: the original function
    (saving it would save the model's weights a second time, beside the compiled
    libraries) and the libraries by input shape (tuple keys, which trackable
    dicts refuse)."""

    fn: Any
    name: str
    input_signature: list[tf.TensorSpec]
    target: Target
    cache_dir: Path
    trials: int
    compiled: dict[Shapes, _Compiled] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def compile(  # noqa: A001  (the public name mirrors tf.function / torch.compile)
    fn: Callable[..., Any],
    input_signature: Sequence[tf.TensorSpec] | None = None,
    *,
    batch_sizes: Sequence[int] = (),
    target: Target | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    tune: bool | int = False,
) -> CompiledFunction:
    """Compiles ``fn`` (a Keras model or layer, a tf.function or a plain callable of
    tensors) with TVM: each static input shape compiles on its first call, or now
    for the ``batch_sizes`` named.

    Args:
      fn: what to compile. Keras models are called with ``training=False``.
      input_signature: one TensorSpec per positional input; ``None`` dimensions
        are filled from each call's inputs (one compile per static shape). For a
        Keras model, by default its inputs' specs.
      batch_sizes: compile now for each of these sizes of the first dimension
        (where the signature leaves it ``None``; every other dimension must be
        known). A function traced with an unknown batch (a SavedModel's serving
        signature) runs whichever compiled shape each call's inputs have.
      target: a TVM target (its string or dict form), or ``"native"`` for this
        machine's CPU; default ``DEFAULT_TARGET`` (portable x86-64), or
        ``"native"`` with ``tune``. A library that uses extensions a CPU lacks
        is refused there with an error, never run.
      cache_dir: the cache folder; default ``$TVMDSOOP_CACHE_DIR``, else
        ``~/.cache/tvmdsoop``.
      tune: tune the kernels with TVM's MetaSchedule before compiling, measuring
        candidates on this machine: ``True`` for ``DEFAULT_TUNING_TRIALS``
        trials in all, or a number of trials. Minutes per shape, once: the
        library, the faster of the tuned and the untuned one on this machine,
        is cached like any other. Needs the ``tune`` extra.
    """
    if input_signature is None:
        if not isinstance(fn, keras.Model):
            raise ValueError("tf_op.compile: input_signature is required unless fn is a Keras model")
        input_signature = [tf.TensorSpec(t.shape, t.dtype) for t in fn.inputs]
    trials = _tuning_trials(tune)
    target = target or (HOST_TARGET if trials else DEFAULT_TARGET)
    kind = _target_kind(target)
    if kind not in ("llvm", "cuda"):
        raise ValueError(f"tf_op.compile: the op runs CPU (llvm) and CUDA libraries, got target {target!r}")
    if trials and kind != "llvm":
        raise ValueError(f"tf_op.compile: tune is for CPU targets (it measures candidates on this machine), "
                         f"got target {target!r}")
    compiled = CompiledFunction(fn, input_signature, target, _cache_dir(cache_dir), trials)
    for batch in batch_sizes:
        compiled.compile_for(compiled.batch_shapes(batch))
    return compiled


class CompiledFunction(tf.Module):
    """The callable ``compile`` returns; holds one compiled library per static input shape.

    A ``tf.Module``: kept on the object a SavedModel saves, it carries the
    libraries compiled so far as assets, and a function traced with an unknown
    dimension (a serving signature) dispatches each call to the library of its
    inputs' shapes; another shape is an ``InvalidArgumentError`` that lists the
    compiled ones."""

    def __init__(self, fn: Callable[..., Any], input_signature: Sequence[tf.TensorSpec],
                 target: Target, cache_dir: Path, trials: int = 0) -> None:
        super().__init__(name=None)
        name = getattr(fn, "name", None) or getattr(fn, "__name__", type(fn).__name__)
        self._state = _State(tf.function(_traceable(fn)), name, [tf.TensorSpec.from_spec(s) for s in input_signature],
                             target, cache_dir, trials)
        # Tracked: the compiled functions and, through them, their libraries.
        self._funcs: list[Func] = []

    @property
    def input_signature(self) -> list[tf.TensorSpec]:
        return list(self._state.input_signature)

    @property
    def target(self) -> Target:
        return self._state.target

    @property
    def cache_dir(self) -> Path:
        return self._state.cache_dir

    @property
    def library_paths(self) -> dict[Shapes, Path]:
        """The cache entry of each input shape compiled so far."""
        return {shapes: c.lib_path for shapes, c in self._state.compiled.items()}

    def __call__(self, *args: Any) -> Any:
        state = self._state
        if len(args) != len(state.input_signature):
            raise TypeError(f"tf_op.compile({state.name}): takes {len(state.input_signature)} inputs, got {len(args)}")
        tensors = [tf.convert_to_tensor(a, dtype=s.dtype) for a, s in zip(args, state.input_signature)]
        shapes = [self._merged_shape(t, s, i) for i, (t, s) in enumerate(zip(tensors, state.input_signature))]
        if all(shape.is_fully_defined() for shape in shapes):
            return self._run(self.compile_for(tuple(tuple(s.as_list()) for s in shapes)), tensors)
        return self._dispatch(tensors, shapes)

    def batch_shapes(self, batch: int) -> Shapes:
        """The input shapes for batch size ``batch``: the signature with its
        unknown first dimensions set to it."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"tf_op.compile({self._state.name}): batch sizes are positive ints, got {batch!r}")
        shapes = []
        for i, spec in enumerate(self._state.input_signature):
            dims = spec.shape.as_list() if spec.shape.rank else []
            if dims and dims[0] is None:
                dims[0] = batch
            if spec.shape.rank is None or None in dims:
                raise ValueError(f"tf_op.compile({self._state.name}): batch_sizes sets the first dimension only, "
                                 f"but input {i} has shape {spec.shape}")
            shapes.append(tuple(dims))
        return tuple(shapes)

    def compile_for(self, shapes: Shapes) -> _Compiled:
        """The library for these static input shapes: compiled (or taken from the
        cache) on first use."""
        state = self._state
        compiled = state.compiled.get(shapes)
        if compiled is None:
            with state.lock:
                compiled = state.compiled.get(shapes)
                if compiled is None:
                    # Out of any graph being traced: the converter runs eagerly.
                    with tf.init_scope():
                        compiled = state.compiled[shapes] = self._build(shapes)
                    self._funcs.append(compiled.func)
        return compiled

    def _merged_shape(self, t: tf.Tensor, spec: tf.TensorSpec, i: int) -> tf.TensorShape:
        if not spec.shape.is_compatible_with(t.shape):
            raise ValueError(f"tf_op.compile({self._state.name}): input {i} has shape {t.shape}, expected {spec.shape}")
        return spec.shape.merge_with(t.shape)

    @staticmethod
    def _run(compiled: _Compiled, tensors: Sequence[tf.Tensor]) -> Any:
        return tf.nest.pack_sequence_as(compiled.structure, list(compiled.func(*tensors)))

    def _dispatch(self, tensors: list[tf.Tensor], shapes: list[tf.TensorShape]) -> Any:
        """Inputs whose shape is known only when the graph runs (a function traced
        with an unknown dimension): one branch per compiled shape that fits, chosen
        by the inputs' runtime shapes; any other shape fails with the list."""
        state = self._state
        candidates = [(key, c) for key, c in sorted(state.compiled.items())
                      if all(shape.is_compatible_with(dims) for shape, dims in zip(shapes, key))]
        if not candidates:
            raise ValueError(f"tf_op.compile({state.name}): input shapes {[s.as_list() for s in shapes]} are not "
                             "static when traced and no compiled shape fits them; TVM compiles static shapes: give "
                             "the tf.function a static input_signature, or compile shapes ahead with batch_sizes=")
        matches = [tf.reduce_all([tf.reduce_all(tf.equal(tf.shape(t, out_type=tf.int64), dims))
                                  for t, dims in zip(tensors, key)]) for key, _ in candidates]
        index = tf.reduce_min(tf.where(tf.stack(matches), tf.range(len(candidates)), len(candidates)))

        # The branch gives its inputs their static shape with a reshape (a no-op:
        # the index chose the branch whose shapes they have). Not tf.ensure_shape:
        # in a Session (TF Serving, TF1), where the Case is lowered to Switch/Merge,
        # the EnsureShape of branches not taken runs too and fails.
        def branch(key: Shapes, compiled: _Compiled) -> Callable[[], list[tf.Tensor]]:
            return lambda: tf.nest.flatten(self._run(compiled, [tf.reshape(t, dims) for t, dims in zip(tensors, key)]))

        def not_compiled() -> list[tf.Tensor]:
            listed = "; ".join(str([list(d) for d in key]) for key, _ in candidates)
            check = tf.debugging.Assert(False, [f"tf_op.compile({state.name}): no library was compiled for the "
                                                f"input shapes that follow; compiled: {listed}"]
                                        + [tf.shape(t) for t in tensors])
            first = tf.nest.flatten(candidates[0][1].structure)
            with tf.control_dependencies([check]):
                return [tf.zeros(out.shape, out.dtype) for out in first]

        flat = tf.switch_case(index, [branch(key, c) for key, c in candidates], default=not_compiled)
        return tf.nest.pack_sequence_as(candidates[0][1].structure, flat)

    def _build(self, shapes: Shapes) -> _Compiled:
        """Trace -> TFLite -> (cache or TVM worker) -> a TVMDSOOp for one input shape."""
        state = self._state
        start = time.perf_counter()
        specs = [tf.TensorSpec(shape, s.dtype, name=s.name or f"input_{i}")
                 for i, (shape, s) in enumerate(zip(shapes, state.input_signature))]
        concrete = state.fn.get_concrete_function(*specs)
        flat_outputs = tf.nest.flatten(concrete.structured_outputs)
        for k, out in enumerate(flat_outputs):
            if not out.shape.is_fully_defined():
                raise CompileError(f"tf_op.compile({state.name}): output {k} has shape {out.shape} for inputs "
                                   f"{list(shapes)}; only static output shapes are supported")
        logger.info("traced %s for %s in %.2f s", state.name, list(shapes), time.perf_counter() - start)

        start = time.perf_counter()
        tflite_bytes = _to_tflite(concrete, state.name)
        logger.info("converted %s to TFLite (%d bytes) in %.2f s", state.name, len(tflite_bytes), time.perf_counter() - start)

        lib_path, digest = _cached_library(tflite_bytes, state.target, state.trials, state.cache_dir, state.name)
        start = time.perf_counter()
        func = Module(str(lib_path), sha256=digest).func(
            "main", output_shapes=[out.shape.as_list() for out in flat_outputs],
            output_dtypes=[out.dtype for out in flat_outputs], device=_device(state.target))
        logger.info("loaded %s in %.2f s", lib_path, time.perf_counter() - start)
        return _Compiled(lib_path, func, concrete.structured_outputs)

    def __repr__(self) -> str:
        return f"tf_op.compile({self._state.name}, target={self.target!r}, shapes={list(self._state.compiled)})"


def _traceable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function to retrace at each static shape: a tf.function's own
    (its input_signature would otherwise keep the dimensions unknown), a Keras
    model called for inference."""
    if isinstance(fn, keras.Layer):
        return lambda *args: fn(*args, training=False)
    return getattr(fn, "python_function", fn)


def _to_tflite(concrete: Any, name: str) -> bytes:
    """The concrete function as a float TFLite flatbuffer, weights frozen.

    No trackable object goes to the converter on purpose: with one it keeps
    variables as resource variables (VAR_HANDLE / READ_VARIABLE, which TVM's
    frontend rejects); without, it freezes them into constants. No
    optimizations: weights stay float32, so TVM matches TF to rounding."""
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.optimizations = []
    try:
        return converter.convert()
    except Exception as err:  # noqa: BLE001  (the converter raises several types; all mean "cannot")
        raise CompileError(f"tf_op.compile({name}): TF's TFLite converter rejected the function: {err}") from err


def _target_kind(target: Target) -> str:
    """The TVM target kind of a kind name, a tag or a dict: ``nvidia/...`` tags
    are CUDA, TVM's other tags name CPUs."""
    if target == HOST_TARGET:
        return "llvm"
    name = str(target.get("kind") or target.get("tag") or "" if isinstance(target, dict) else target)
    return "cuda" if name.startswith("nvidia/") else "llvm" if "/" in name else name


def _device(target: Target) -> str | None:
    """Where a library compiled for ``target`` runs: a CUDA library on the
    first GPU (its kernels and the VM's memory are there; this overrides a
    ``tf.device`` around the call), a CPU one where TF places it."""
    return "/GPU:0" if _target_kind(target) == "cuda" else None


def _tuning_trials(tune: bool | int) -> int:
    if tune is True:
        return DEFAULT_TUNING_TRIALS
    if tune is False:
        return 0
    if not isinstance(tune, int) or tune < 0:
        raise ValueError(f"tf_op.compile: tune is True, False or a number of trials >= 0, got {tune!r}")
    return tune


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    chosen = cache_dir or os.environ.get("TVMDSOOP_CACHE_DIR") or Path.home() / ".cache" / "tvmdsoop"
    return Path(chosen).expanduser()


def _tvm_python() -> str:
    return os.environ.get("TVMDSOOP_TVM_PYTHON") or sys.executable


@functools.lru_cache(maxsize=None)
def _tvm_version(python: str) -> str:
    """The TVM version of ``python``, without importing TVM into this process."""
    if python == sys.executable:
        try:
            return importlib.metadata.version("apache-tvm")
        except importlib.metadata.PackageNotFoundError as err:
            raise CompileError(f"tf_op.compile: {python} has no apache-tvm: install it, or set "
                               "TVMDSOOP_TVM_PYTHON to a Python that has it") from err
    result = subprocess.run([python, str(_WORKER), "--version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"tf_op.compile: {python} has no apache-tvm: {_tail(result.stderr)}")
    return result.stdout.strip()


@functools.lru_cache(maxsize=None)
def _host_target(python: str, tvm_version: str, cache_dir: Path) -> dict[str, Any]:
    """``HOST_TARGET`` resolved by ``python``'s TVM: the cache key needs the
    CPU's name, and only TVM's LLVM knows it. Starting TVM for it takes seconds,
    so the answer is kept in ``cache_dir`` (which exists) under what it depends on
    (the TVM, the CPU's model and the flags /proc/cpuinfo lists) for the next process."""
    cpu = _cpu_identity()
    identity = json.dumps({"format": FORMAT_VERSION, "python": python, "tvm": tvm_version, "cpu": cpu}, sort_keys=True)
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
    result = subprocess.run([python, str(_WORKER), "--host-target"], capture_output=True, text=True)
    try:
        if result.returncode != 0:
            raise ValueError(f"exit {result.returncode}")
        target = json.loads(result.stdout.strip().splitlines()[-1])
        if not _is_host_target(target):
            raise ValueError(f"not a CPU target: {target!r}")
    except (IndexError, ValueError) as err:
        raise CompileError(f"tf_op.compile: {python} could not name this machine's CPU ({err}): "
                           f"{_tail(result.stderr)}") from err
    if cpu:
        _write_atomically(kept, json.dumps(target).encode())
    return target


def _cpu_identity() -> str:
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


def _resolved(target: Target, python: str, tvm_version: str, cache_dir: Path) -> Target:
    if target != HOST_TARGET:
        return target
    return dict(_host_target(python, tvm_version, cache_dir))  # a copy: the cached one stays


def _cache_key(tflite_bytes: bytes, target: Target, trials: int, tvm_version: str) -> str:
    # A tuned compile keeps whichever of the tuned and the untuned library ran
    # faster with the worker's TVM thread settings, which it inherits from here,
    # on this many CPUs (TVM's thread count when unset, MetaSchedule's num-cores).
    threads: dict[str, str] = {}
    if trials:
        threads = {"cpus": str(os.cpu_count()), **{name: os.environ.get(name, "") for name in _TVM_THREAD_SETTINGS}}
    header = json.dumps({"format": FORMAT_VERSION, "target": target, "trials": trials, "tvm": tvm_version,
                         "tvm_threads": threads, "worker": _worker_digest()}, sort_keys=True)
    return hashlib.sha256(header.encode() + b"\0" + tflite_bytes).hexdigest()


@functools.lru_cache(maxsize=None)
def _worker_digest() -> str:
    """The SHA-256 of the TVM worker's source (``_tvm_compile.py`` and the modules
    beside it that it runs, ``_tvm_*.py``): a library another worker compiled, with
    other schedule steps or math, is another cache entry."""
    digest = hashlib.sha256()
    for path in sorted(_WORKER.parent.glob("_tvm_*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cached_library(tflite_bytes: bytes, target: Target, trials: int, cache_dir: Path,
                    name: str) -> tuple[Path, str]:
    """The library for this TFLite model, target and tuning budget, and its sha256:
    from the cache when its entry is whole (its recorded digest matches), else
    compiled now."""
    python = _tvm_python()
    version = _tvm_version(python)  # first: its error names the fix for a Python without TVM
    cache_dir.mkdir(parents=True, exist_ok=True)  # the resolved host target is kept there too
    target = _resolved(target, python, version, cache_dir)
    key = _cache_key(tflite_bytes, target, trials, version)
    lib_path, digest_path = cache_dir / f"{key}.so", cache_dir / f"{key}.so.sha256"
    with _exclusive(cache_dir / f"{key}.lock"):
        if lib_path.is_file() and digest_path.is_file():
            recorded = digest_path.read_text().strip()
            if file_sha256(lib_path) == recorded:
                logger.info("cache hit for %s: %s", name, lib_path)
                return lib_path, recorded
            logger.warning("cache entry %s does not match its recorded sha256: rebuilding it", lib_path)
        digest = _compile_into(tflite_bytes, target, trials, python, lib_path, name)
        _write_atomically(digest_path, digest.encode() + b"\n")
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


def _compile_into(tflite_bytes: bytes, target: Target, trials: int, python: str, lib_path: Path,
                  name: str) -> str:
    """Runs the TVM worker into a temporary file beside ``lib_path`` and renames it
    into place, so a failed or interrupted compile leaves nothing under the key."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=lib_path.parent) as tmp:
        tflite_path, out_path = Path(tmp, "model.tflite"), Path(tmp, "model.so")
        tflite_path.write_bytes(tflite_bytes)
        returncode, output = _run_worker(
            [python, str(_WORKER), str(tflite_path), str(out_path), json.dumps(target), str(trials)], name)
        if returncode != 0 or not out_path.is_file():
            raise CompileError(f"tf_op.compile({name}): TVM could not compile the model for target "
                               f"{target!r} (exit {returncode}):\n{_tail(output)}")
        digest = file_sha256(out_path)
        os.replace(out_path, lib_path)
    figures = output.strip().splitlines()[-1] if output.strip() else ""
    logger.info("TVM compiled %s in %.2f s (%s): %s", name, time.perf_counter() - start, figures, lib_path)
    return digest


def _run_worker(command: list[str], name: str) -> tuple[int, str]:
    """Runs the TVM worker, logging its progress lines as they come (a tuning
    compile takes minutes: the user sees which stage it is at) and TVM's own
    output at DEBUG; its exit status and everything it wrote."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as worker:
        assert worker.stdout is not None
        for line in worker.stdout:
            lines.append(line)
            if line.startswith("tvmdsoop: "):
                logger.info("%s: %s", name, line[len("tvmdsoop: "):].rstrip())
            else:
                logger.debug("%s: TVM: %s", name, line.rstrip())
    return worker.returncode, "".join(lines)


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_STDERR_TAIL_LINES:])
