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

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tf_op.module import Func, Module, file_sha256

logger = logging.getLogger("tf_op.bridge")

#: Portable x86-64: no instruction a baseline x86-64 CPU lacks (plain ``llvm``
#: would tune for, and use the extensions of, the build machine's CPU).
DEFAULT_TARGET: dict[str, str] = {"kind": "llvm", "mcpu": "x86-64"}

#: Part of every cache key: raise it when what a cache entry holds, or how it is
#: made, changes, so that old entries are not reused.
FORMAT_VERSION = 1

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


def compile(  # noqa: A001  (the public name mirrors tf.function / torch.compile)
    fn: Callable[..., Any],
    input_signature: Sequence[tf.TensorSpec] | None = None,
    *,
    target: Target | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CompiledFunction:
    """Compiles ``fn`` (a Keras model or layer, a tf.function or a plain callable of
    tensors) with TVM, lazily: each static input shape compiles on its first call.

    Args:
      fn: what to compile. Keras models are called with ``training=False``.
      input_signature: one TensorSpec per positional input; ``None`` dimensions
        are filled from each call's inputs (one compile per static shape). For a
        Keras model, by default its inputs' specs.
      target: a TVM target (its string or dict form); default ``DEFAULT_TARGET``.
      cache_dir: the cache folder; default ``$TVMDSOOP_CACHE_DIR``, else
        ``~/.cache/tvmdsoop``.
    """
    if input_signature is None:
        if not isinstance(fn, keras.Model):
            raise ValueError("tf_op.compile: input_signature is required unless fn is a Keras model")
        input_signature = [tf.TensorSpec(t.shape, t.dtype) for t in fn.inputs]
    return CompiledFunction(fn, input_signature, target or DEFAULT_TARGET, _cache_dir(cache_dir))


class CompiledFunction:
    """The callable ``compile`` returns; holds one compiled library per static input shape."""

    def __init__(self, fn: Callable[..., Any], input_signature: Sequence[tf.TensorSpec],
                 target: Target, cache_dir: Path) -> None:
        self.input_signature = [tf.TensorSpec.from_spec(s) for s in input_signature]
        self.target = target
        self.cache_dir = cache_dir
        self._name = getattr(fn, "name", None) or getattr(fn, "__name__", type(fn).__name__)
        self._fn = tf.function(_traceable(fn))
        self._compiled: dict[tuple[tuple[int, ...], ...], _Compiled] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.input_signature):
            raise TypeError(f"tf_op.compile({self._name}): takes {len(self.input_signature)} inputs, got {len(args)}")
        tensors = [tf.convert_to_tensor(a, dtype=s.dtype) for a, s in zip(args, self.input_signature)]
        shapes = tuple(self._static_shape(t, s, i) for i, (t, s) in enumerate(zip(tensors, self.input_signature)))
        compiled = self._compiled.get(shapes)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(shapes) or self._build(shapes)
                self._compiled[shapes] = compiled
        outputs = compiled.func(*tensors)
        return tf.nest.pack_sequence_as(compiled.structure, list(outputs))

    @property
    def library_paths(self) -> dict[tuple[tuple[int, ...], ...], Path]:
        """The cache entry of each input shape compiled so far."""
        return {shapes: c.lib_path for shapes, c in self._compiled.items()}

    def _static_shape(self, t: tf.Tensor, spec: tf.TensorSpec, i: int) -> tuple[int, ...]:
        """The input's fully known shape: TVM compiles static shapes, so inside a
        tf.function the shape must be known when it is traced."""
        if not spec.shape.is_compatible_with(t.shape):
            raise ValueError(f"tf_op.compile({self._name}): input {i} has shape {t.shape}, expected {spec.shape}")
        shape = spec.shape.merge_with(t.shape)
        if not shape.is_fully_defined():
            raise ValueError(f"tf_op.compile({self._name}): input {i} has shape {shape} when traced; "
                             "TVM compiles static shapes: give the tf.function a static input_signature")
        return tuple(shape.as_list())

    def _build(self, shapes: tuple[tuple[int, ...], ...]) -> _Compiled:
        """Trace -> TFLite -> (cache or TVM worker) -> a TVMDSOOp for one input shape."""
        start = time.perf_counter()
        specs = [tf.TensorSpec(shape, s.dtype, name=s.name or f"input_{i}")
                 for i, (shape, s) in enumerate(zip(shapes, self.input_signature))]
        concrete = self._fn.get_concrete_function(*specs)
        flat_outputs = tf.nest.flatten(concrete.structured_outputs)
        for k, out in enumerate(flat_outputs):
            if not out.shape.is_fully_defined():
                raise CompileError(f"tf_op.compile({self._name}): output {k} has shape {out.shape} for inputs "
                                   f"{list(shapes)}; only static output shapes are supported")
        logger.info("traced %s for %s in %.2f s", self._name, list(shapes), time.perf_counter() - start)

        start = time.perf_counter()
        tflite_bytes = _to_tflite(concrete, self._name)
        logger.info("converted %s to TFLite (%d bytes) in %.2f s", self._name, len(tflite_bytes), time.perf_counter() - start)

        lib_path, digest = _cached_library(tflite_bytes, self.target, self.cache_dir, self._name)
        start = time.perf_counter()
        func = Module(str(lib_path), sha256=digest).func(
            "main", output_shapes=[out.shape.as_list() for out in flat_outputs],
            output_dtypes=[out.dtype for out in flat_outputs])
        logger.info("loaded %s in %.2f s", lib_path, time.perf_counter() - start)
        return _Compiled(lib_path, func, concrete.structured_outputs)

    def __repr__(self) -> str:
        return f"tf_op.compile({self._name}, target={self.target!r}, shapes={list(self._compiled)})"


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


def _cache_key(tflite_bytes: bytes, target: Target, tvm_version: str) -> str:
    header = json.dumps({"format": FORMAT_VERSION, "target": target, "tvm": tvm_version}, sort_keys=True)
    return hashlib.sha256(header.encode() + b"\0" + tflite_bytes).hexdigest()


def _cached_library(tflite_bytes: bytes, target: Target, cache_dir: Path, name: str) -> tuple[Path, str]:
    """The library for this TFLite model and target, and its sha256: from the cache
    when its entry is whole (its recorded digest matches), else compiled now."""
    python = _tvm_python()
    key = _cache_key(tflite_bytes, target, _tvm_version(python))
    lib_path, digest_path = cache_dir / f"{key}.so", cache_dir / f"{key}.so.sha256"
    if lib_path.is_file() and digest_path.is_file():
        recorded = digest_path.read_text().strip()
        if file_sha256(lib_path) == recorded:
            logger.info("cache hit for %s: %s", name, lib_path)
            return lib_path, recorded
        logger.warning("cache entry %s does not match its recorded sha256: rebuilding it", lib_path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = _compile_into(tflite_bytes, target, python, lib_path, name)
    _write_atomically(digest_path, digest.encode() + b"\n")
    return lib_path, digest


def _compile_into(tflite_bytes: bytes, target: Target, python: str, lib_path: Path, name: str) -> str:
    """Runs the TVM worker into a temporary file beside ``lib_path`` and renames it
    into place, so a failed or interrupted compile leaves nothing under the key."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=lib_path.parent) as tmp:
        tflite_path, out_path = Path(tmp, "model.tflite"), Path(tmp, "model.so")
        tflite_path.write_bytes(tflite_bytes)
        result = subprocess.run([python, str(_WORKER), str(tflite_path), str(out_path), json.dumps(target)],
                                capture_output=True, text=True)
        if result.returncode != 0 or not out_path.is_file():
            raise CompileError(f"tf_op.compile({name}): TVM could not compile the model for target "
                               f"{target!r} (exit {result.returncode}):\n{_tail(result.stderr)}")
        digest = file_sha256(out_path)
        os.replace(out_path, lib_path)
    logger.info("TVM compiled %s in %.2f s (%s): %s", name, time.perf_counter() - start,
                result.stdout.strip(), lib_path)
    return digest


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
