"""``CompiledFunction``: what ``tf_op.compile`` returns. One TVM library per
static input shape, each compiled on first use, and the dispatch among them of
inputs whose shape is known only when the graph runs."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.eager import record  # whether a tape records: TF has no public way to ask
from tensorflow.python.framework.ops import EagerTensor  # its dtype enum, at C speed
from tensorflow.python.ops import resource_variable_ops

from tf_op import _eager
from tf_op.compiler import cache, targets, tflite_conversion, unroll, worker
from tf_op.compiler.progress import Progress
from tf_op.compiler.errors import CompileError
from tf_op.compiler.targets import Target
from tf_op.module import Func, Module

logger = logging.getLogger(__package__)


@dataclass(frozen=True)
class _Compiled:
    """One static input shape's library, the op that runs it, how to pack its
    flat outputs into the original function's structure, and the trainable
    variables the library holds as constants, each with what says whether it
    trains now: its Keras variable (``layer.trainable = False`` clears that
    flag, not the one of the tf.Variable under it, which TF's tapes read), or
    the tf.Variable itself."""

    lib_path: Path
    func: Func
    structure: Any
    variables: tuple[tuple[tf.Variable, Any], ...]
    #: What packs the flat outputs into ``structure`` where it is nested (a
    #: tuple, dict...); None where it is one tensor.
    pack: Callable[[list[tf.Tensor]], Any] | None

    def outputs(self, tensors: Sequence[tf.Tensor]) -> Any:
        """The op's outputs for ``tensors`` (of the signature's dtypes already),
        in the original function's structure: a single tensor as it is, without
        tf.nest (2 µs an eager call)."""
        return self._packed(self.func.run(list(tensors)))

    def outputs_unrecorded(self, tensors: list[tf.Tensor]) -> Any:
        """``outputs`` of an eager call that no tape could record: the op
        library's eager entry first, without asking again what the caller knows
        (each question costs 0.2-0.4 µs of an eager call that may take 10)."""
        flat = self.func.entry_outputs(tensors)
        return self._packed(flat if flat is not None else self.func.run(tensors))

    def _packed(self, flat: list[tf.Tensor]) -> Any:
        return self.pack(flat) if self.pack is not None else flat[0]


Shapes = tuple[tuple[int, ...], ...]


@dataclass
class _State:
    """What CompiledFunction keeps out of TF's tracking: the original function
    and Keras layer (saving them would save the model's weights a second time,
    beside the compiled libraries) and the libraries by input shape (tuple keys,
    which trackable dicts refuse)."""

    fn: Any
    layer: keras.Layer | None
    name: str
    input_signature: list[tf.TensorSpec]
    target: Target
    cache_dir: Path
    trials: int
    compiled: dict[Shapes, _Compiled] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The signature's TF dtype enums, which an eager tensor's own compare with
    #: at C speed (its ``dtype`` is a Python property: 0.3 µs an input).
    dtype_enums: tuple[int, ...] = ()
    #: The shapes called eagerly through the op library's eager entry: its
    #: function and how to pack the outputs (None: the one output), for
    #: ``_eager.call_compiled``.
    hits: dict[Shapes, tuple[Any, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dtype_enums = tuple(s.dtype.as_datatype_enum for s in self.input_signature)


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
        self._state = _State(tf.function(_traceable(fn)), fn if isinstance(fn, keras.Layer) else None, name,
                             [tf.TensorSpec.from_spec(s) for s in input_signature], target, cache_dir, trials)
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
        if state.hits:  # the eager entry's call of shapes it ran before, where it takes this one
            outputs = _eager.call_compiled(state.hits, state.dtype_enums, args)
            if outputs is not None:
                return outputs
        if len(args) != len(state.input_signature):
            raise TypeError(f"tf_op.compile({state.name}): takes {len(state.input_signature)} inputs, got {len(args)}")
        eager = tf.executing_eagerly()
        # Eager tensors of the signature's dtypes go in as they are (a conversion
        # costs 3 µs each); what else comes is converted.
        tensors = [a if eager and isinstance(a, EagerTensor) and a._datatype_enum() == e
                   else tf.convert_to_tensor(a, dtype=s.dtype)
                   for a, s, e in zip(args, state.input_signature, state.dtype_enums)]
        # Eagerly, inputs of a shape compiled before: their library, without
        # merging shapes (a third of a small model's eager call).
        key = tuple([t._shape_tuple() for t in tensors]) if eager else None
        compiled = state.compiled.get(key)  # None for key None: not eager
        if compiled is not None:
            if record.could_possibly_record():
                return self._recorded(compiled.outputs, tensors)
            outputs = compiled.outputs_unrecorded(tensors)
            entry = compiled.func._eager.call
            if entry is not None and entry is not False and key not in state.hits:
                state.hits[key] = (entry, compiled.pack)  # opened: the next calls of these shapes are its
            return outputs
        shapes = [self._merged_shape(t, s, i) for i, (t, s) in enumerate(zip(tensors, state.input_signature))]
        if all(shape.is_fully_defined() for shape in shapes):
            static = tuple(tuple(s.as_list()) for s in shapes)
            if eager and state.compiled and static not in state.compiled:
                # Eager calls see each batch size as a new shape, and each new
                # shape compiles: what the user should know once per shape.
                logger.warning("tf_op.compile(%s): compiling again, for the new input shapes %s (compiled: %s); "
                               "compile the shapes ahead with batch_sizes= to keep compiles out of the calls", state.name,
                               [list(s) for s in static], "; ".join(str([list(d) for d in k]) for k in state.compiled))
            run = self.compile_for(static).outputs
        else:
            run = functools.partial(self._dispatch, shapes=shapes)
        # Under no tape (inference, eager or traced) the op runs alone.
        return self._recorded(run, tensors) if record.could_possibly_record() else run(tensors)

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

    def _recorded(self, run: Callable[[list[tf.Tensor]], Any], tensors: list[tf.Tensor]) -> Any:
        """``run(tensors)`` for a tape: a gradient that reaches it, for the inputs or
        for the variables the libraries froze, is an error that says why. Without
        this the variables, which the op does not read, would get a silent None (an
        optimizer would skip them), and the inputs TVMDSOOp's error about
        Module.func(grad=). Around the dispatch among shapes too, not in its
        branches, whose gradient could not take the variables' handles.

        Not a real gradient: TF's gradient of the original function would be right
        once, but an optimizer's update never reaches the constants the library
        runs, and its gradient function would capture variables a SavedModel of
        the library does not hold."""
        frozen = list({id(v): v for c in list(self._state.compiled.values())
                       for v, trains in c.variables if trains.trainable}.values())
        for v in frozen:
            # What a read of it does for the tapes, without the read: they watch
            # it, and its handle is an input of the recorded call.
            resource_variable_ops.variable_accessed(v)

        @tf.custom_gradient
        def call(*inputs: tf.Tensor) -> tuple[Any, Callable[..., list[tf.Tensor | None]]]:
            def grad(*upstream: tf.Tensor) -> list[tf.Tensor | None]:
                message = _no_gradient_message(self._state.name, frozen)
                if tf.executing_eagerly():
                    raise tf.errors.InvalidArgumentError(None, None, message)
                # In a graph, an error when the gradient runs, not when it is built:
                # TF builds the backward function of a tf.function called under a
                # tape with its forward pass, and a SavedModel traces it to save it.
                with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
                    return ([tf.zeros_like(x) if x.dtype.is_floating else None for x in inputs[:len(tensors)]]
                            + [tf.zeros(v.shape, v.dtype) for v in frozen])

            return run(list(inputs[:len(tensors)])), grad

        return call(*tensors, *(v.handle for v in frozen))

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
            return lambda: tf.nest.flatten(compiled.outputs([tf.reshape(t, dims) for t, dims in zip(tensors, key)]))

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
        """Trace -> fingerprint -> (cache, or TFLite and the TVM worker) -> a
        TVMDSOOp for one input shape, each stage said (progress.py)."""
        with Progress(self._state.name) as progress:
            return self._build_saying(shapes, progress)

    def _build_saying(self, shapes: Shapes, progress: Progress) -> _Compiled:
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
        progress.stage(f"traced for input shapes {[list(s) for s in shapes]} in {time.perf_counter() - start:.2f} s")

        start = time.perf_counter()
        fingerprint = tflite_conversion.fingerprint(concrete)
        logger.info("fingerprinted %s (its graph, %d bytes, and %d captured values, %.1f MB) in %.2f s",
                    state.name, fingerprint.graph_bytes, fingerprint.values, fingerprint.value_bytes / 1e6,
                    time.perf_counter() - start)

        def tflite() -> bytes:
            start = time.perf_counter()
            tflite_bytes = tflite_conversion.to_tflite(unroll.unrolled(concrete), state.name)
            progress.stage(f"converted to TFLite ({len(tflite_bytes) / 1e6:.1f} MB) in "
                           f"{time.perf_counter() - start:.2f} s")
            # The converter reads the variables now, not when they were
            # fingerprinted: had another thread assigned one since, the library
            # would be cached under the key of values it does not hold.
            if tflite_conversion.fingerprint(concrete) != fingerprint:
                raise CompileError(f"tf_op.compile({state.name}): its variables changed while it was compiled; "
                                   "compile it again when they stay still")
            return tflite_bytes

        lib_path, digest = _library(fingerprint.digest, tflite, state.target, state.trials, state.cache_dir, progress)
        start = time.perf_counter()
        func = Module(str(lib_path), sha256=digest).func(
            "main", output_shapes=[out.shape.as_list() for out in flat_outputs],
            output_dtypes=[out.dtype for out in flat_outputs], device=targets.device(state.target))
        progress.stage(f"loaded {lib_path} in {time.perf_counter() - start:.2f} s")
        keras_variables = {id(v.value): v for v in state.layer.variables} if state.layer else {}
        variables = tuple((v, keras_variables.get(id(v), v)) for v in concrete.trainable_variables)
        structure = concrete.structured_outputs
        pack = functools.partial(tf.nest.pack_sequence_as, structure) if tf.nest.is_nested(structure) else None
        return _Compiled(lib_path, func, structure, variables, pack)

    def __repr__(self) -> str:
        return f"tf_op.compile({self._state.name}, target={self.target!r}, shapes={list(self._state.compiled)})"


def _traceable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function to retrace at each static shape: a tf.function's own
    (its input_signature would otherwise keep the dimensions unknown), a Keras
    model called for inference."""
    if isinstance(fn, keras.Layer):
        return lambda *args: fn(*args, training=False)
    return getattr(fn, "python_function", fn)


def _no_gradient_message(name: str, variables: Sequence[tf.Variable]) -> str:
    listed = ", ".join(v.name.removesuffix(":0") for v in variables[:6]) + (", ..." if len(variables) > 6 else "")
    frozen = f"its {len(variables)} trainable variables ({listed})" if variables else "its variables"
    return (f"tf_op.compile({name}) has no gradient: TVM compiled it with {frozen} frozen into the library as "
            "constants, so they get no gradient from it (an update to them would not change what it computes), "
            "nor do its inputs. To train them, call the original function under the tape (and compile it again "
            "after training); to train other variables on its outputs, stop the gradient there, "
            "tf.stop_gradient(compiled(x)), or freeze a Keras model the Keras way: model.trainable = False.")


def _library(fingerprint: str, tflite: Callable[[], bytes], target: Target, trials: int, cache_dir: Path,
             progress: Progress) -> tuple[Path, str]:
    """The library for the function of this fingerprint, target and tuning
    budget, and its sha256: the target resolved (``HOST_TARGET``: this CPU),
    then from the cache, or compiled now by the TVM worker from ``tflite()``."""
    python = worker.tvm_python()
    version = worker.tvm_version(python)  # first: its error names the fix for a Python without TVM
    cache_dir.mkdir(parents=True, exist_ok=True)  # the resolved host target is kept there too
    target = targets.resolved(target, python, version, cache_dir)
    return cache.library(fingerprint, tflite, target, trials, python, version, cache_dir, progress)
