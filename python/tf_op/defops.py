"""TF ops from a library of ``defop`` kernels (``tf_op_tvm.build_ops``):

    ops = tf_op.load_ops("my_ops.so")       # reads my_ops.json beside it
    z = ops.vadd(x, y)                       # eager, tf.function, SavedModel, Keras

Each op picks its variant by its inputs' dtype and rank, knows its outputs'
shapes from the manifest without running anything, and calls the variant
through the TVMDSOOp (zero-copy, as every tf_op function).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import tensorflow as tf

from tf_op.module import Func, Module

#: The manifest format this reader knows (tf_op_tvm.build_ops.MANIFEST_FORMAT).
MANIFEST_FORMAT = "tvmdsoop-defop-1"


def load_ops(path: str | os.PathLike[str], manifest: str | os.PathLike[str] | None = None) -> Ops:
    """The ops of a library built by ``python -m tf_op_tvm.build_ops``, with the
    manifest it wrote beside it (``manifest`` names another). The library is
    pinned to the digest the manifest records: one rebuilt without its manifest
    is refused."""
    library = Path(path)
    manifest_file = Path(manifest) if manifest is not None else library.with_suffix(".json")
    try:
        data = json.loads(manifest_file.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"tf_op.load_ops: {library} has no manifest at {manifest_file}: build_ops writes one beside the library"
        ) from None
    except ValueError as e:
        raise ValueError(f"tf_op.load_ops: the manifest {manifest_file} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("ops"), dict):
        raise ValueError(f"tf_op.load_ops: {manifest_file} is not a defop manifest of format {MANIFEST_FORMAT}")
    device = "/GPU:0" if data.get("device") == "cuda" else None
    return Ops(Module(library, sha256=str(data.get("library_sha256") or "")), data["ops"], device)


class Ops(tf.Module):
    """The ops of one defop library, as attributes (``ops.vadd``). Trackable: a
    SavedModel that keeps it carries the library as an asset."""

    def __init__(self, module: Module, manifest_ops: dict[str, Any], device: str | None = None) -> None:
        super().__init__()
        self.module = module
        #: Where the ops run: a CUDA library's on the first GPU, else where TF places them.
        self.device = device
        self._ops = {}
        for name, spec in manifest_ops.items():
            if not str(name).isidentifier() or hasattr(self, name):
                raise ValueError(f"tf_op.load_ops: {module.lib_path} has an op named {name!r}, which an Ops cannot hold")
            self._ops[name] = DefOp(self, name, spec)
            setattr(self, name, self._ops[name])

    def names(self) -> list[str]:
        """The ops of the library, sorted."""
        return sorted(self._ops)

    def __repr__(self) -> str:
        return f"defop library {self.module.lib_path}"


#: The most Funcs an op keeps for its eager calls (one per variant and output
#: shapes), so that a caller looping over many shapes does not grow it forever.
_EAGER_FUNCS = 64


class DefOp:
    """One op of a defop library; called with tensors, runs the variant of
    their dtype and rank."""

    def __init__(self, ops: Ops, name: str, spec: dict[str, Any]) -> None:
        self._ops = ops
        self.name = name
        self.auto_broadcast = bool(spec.get("auto_broadcast"))
        self.grad_name = spec.get("grad")
        self._variants = {(v["dtype"], int(v["ndim"])): v for v in spec.get("variants", [])}
        # Eager calls' Funcs, by variant and output shapes: making one (a
        # tf.Module, and its checks) took about 0.1 ms, several times the rest
        # of a call.
        self._eager_funcs: dict[tuple[str, tuple[tuple[int, ...], ...]], Func] = {}

    def variants(self) -> list[tuple[str, int]]:
        """The (dtype, rank) pairs built."""
        return sorted(self._variants)

    # Its Python decides on static facts only (dtypes, ranks, known sizes): no
    # need for AutoGraph, which tf.function(ops.vadd) would otherwise apply.
    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args: Any) -> tf.Tensor | tuple[tf.Tensor, ...]:
        inputs = [tf.convert_to_tensor(a) for a in args]
        if not inputs:
            raise ValueError(f"tf_op: op {self.name} needs inputs")
        if any(t.shape.rank is None for t in inputs):
            raise ValueError(f"tf_op: op {self.name}: the inputs' ranks must be known to pick a variant")
        ndim = max(t.shape.rank for t in inputs) if self.auto_broadcast else inputs[0].shape.rank
        variant = self._variant(inputs[0].dtype.name, ndim)
        if len(inputs) != len(variant["inputs"]):
            raise ValueError(f"tf_op: op {self.name} takes {len(variant['inputs'])} inputs, got {len(inputs)}")
        for i, (t, spec) in enumerate(zip(inputs, variant["inputs"])):
            if t.dtype.name != spec["dtype"]:
                raise tf.errors.InvalidArgumentError(
                    None, None, f"tf_op: op {self.name}: input {i} is {t.dtype.name}, the variant takes {spec['dtype']}"
                )
        if self.auto_broadcast:
            inputs = self._broadcast(inputs, ndim)
        else:
            for i, (t, spec) in enumerate(zip(inputs, variant["inputs"])):
                if t.shape.rank != len(spec["shape"]):
                    raise tf.errors.InvalidArgumentError(
                        None, None,
                        f"tf_op: op {self.name}: input {i} has {t.shape.rank} dimensions, the {variant['dtype']} "
                        f"variant of {ndim} dimensions takes {len(spec['shape'])}",
                    )
        shapes = [_shape(o["shape"], inputs) for o in variant["outputs"]]
        inputs = self._checked(inputs, variant, shapes)
        if self.grad_name is None:
            return self._run(variant, inputs, shapes)

        @tf.custom_gradient
        def with_gradient(*xs: tf.Tensor) -> Any:
            ys = self._run(variant, list(xs), shapes)

            def grad(*upstream: tf.Tensor) -> list[tf.Tensor]:
                outputs = list(ys) if isinstance(ys, tuple) else [ys]
                gradient_op = getattr(self._ops, self.grad_name)
                got = gradient_op(*xs, *outputs, *upstream)
                return list(got) if isinstance(got, tuple) else [got]

            return ys, grad

        return with_gradient(*inputs)

    def _variant(self, dtype: str, ndim: int) -> dict[str, Any]:
        variant = self._variants.get((dtype, ndim))
        if variant is not None:
            return variant
        dtypes = sorted({d for d, _ in self._variants})
        ranks = sorted(n for d, n in self._variants if d == dtype)
        if not ranks:
            have = f"it has {', '.join(dtypes)}"
        else:
            have = f"its {dtype} variants have {', '.join(map(str, ranks))} dimensions"
        what = f"{dtype} variant of {ndim} dimensions" if ranks else f"{dtype} variant"
        raise tf.errors.InvalidArgumentError(None, None, f"tf_op: op {self.name} has no {what}; {have}")

    def _broadcast(self, inputs: list[tf.Tensor], ndim: int) -> list[tf.Tensor]:
        """The inputs broadcast to their common shape by NumPy's rules (the graph
        fails where they do not broadcast): an input of that shape already is
        passed as it is, another is broadcast first, a copy, since TVM's kernel
        reads every input at the output's index."""
        inputs = [_with_rank(t, ndim) for t in inputs]
        static = inputs[0].shape
        try:
            for t in inputs[1:]:
                static = tf.broadcast_static_shape(static, t.shape)
        except ValueError:
            shapes = ", ".join(str(t.shape) for t in inputs)
            raise tf.errors.InvalidArgumentError(
                None, None, f"tf_op: op {self.name}: inputs of shapes {shapes} do not broadcast"
            ) from None
        if static.is_fully_defined():
            shape = static.as_list()
        else:
            shape = tf.shape(inputs[0], out_type=tf.int64)
            for t in inputs[1:]:
                shape = tf.broadcast_dynamic_shape(shape, tf.shape(t, out_type=tf.int64))
        return [t if t.shape.is_fully_defined() and t.shape == static else
                tf.ensure_shape(tf.broadcast_to(t, shape), static) for t in inputs]

    def _checked(self, inputs: list[tf.Tensor], variant: dict[str, Any], shapes: list[Any]) -> list[tf.Tensor]:
        """The inputs, after the checks that an input read element by element has
        its output's shape (TVM's kernel would read past a smaller one)."""
        checks = []
        for o, (output, shape) in enumerate(zip(variant["outputs"], shapes)):
            for i in output.get("elementwise_inputs", []):
                message = (f"tf_op: op {self.name}: input {i} is read element by element into output {o}, "
                           f"so it must have that output's shape")
                static = inputs[i].shape
                if static.is_fully_defined() and isinstance(shape, list) and all(isinstance(d, int) for d in shape):
                    if static.as_list() != shape:
                        raise tf.errors.InvalidArgumentError(None, None, f"{message} {shape}, got {static.as_list()}")
                    continue
                checks.append(tf.debugging.assert_equal(tf.shape(inputs[i], out_type=tf.int64),
                                                        tf.cast(shape, tf.int64), message=message))
        if not checks:
            return inputs
        with tf.control_dependencies(checks):
            return [tf.identity(t) for t in inputs]

    def _run(self, variant: dict[str, Any], inputs: list[tf.Tensor], shapes: list[Any]) -> Any:
        static = tf.executing_eagerly() and all(isinstance(s, list) for s in shapes)  # eagerly, sizes are ints
        key = (variant["function"], tuple(tuple(s) for s in shapes)) if static else None
        func = self._eager_funcs.get(key) if key else None
        if func is None:
            func = Func(
                self._ops.module, variant["function"], None, None, 64,
                output_shapes=shapes, output_dtypes=[o["dtype"] for o in variant["outputs"]], device=self._ops.device,
            )
            if key:
                if len(self._eager_funcs) >= _EAGER_FUNCS:
                    self._eager_funcs.pop(next(iter(self._eager_funcs)))  # the oldest
                self._eager_funcs[key] = func
        outputs = func(*inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def __repr__(self) -> str:
        return f"op {self.name} of {self._ops.module.lib_path}"


def _with_rank(t: tf.Tensor, ndim: int) -> tf.Tensor:
    """t with leading 1s up to ndim dimensions (a reshape: no copy)."""
    if t.shape.rank == ndim:
        return t
    lead = [1] * (ndim - t.shape.rank)
    if t.shape.is_fully_defined():
        return tf.reshape(t, lead + t.shape.as_list())
    return tf.ensure_shape(tf.reshape(t, tf.concat([lead, tf.shape(t)], 0)), lead + t.shape.as_list())


def _shape(expr_list: list[Any], inputs: list[tf.Tensor]) -> list[int] | tf.Tensor:
    """An output's shape from its manifest expressions: ints where the inputs'
    static shapes give them, else a 1-D int64 tensor."""
    dims = [_eval(e, inputs) for e in expr_list]
    if all(isinstance(d, int) for d in dims):
        return dims
    return tf.stack([tf.cast(d, tf.int64) for d in dims])


def _eval(expr: Any, inputs: list[tf.Tensor]) -> int | tf.Tensor:
    if isinstance(expr, int):
        return expr
    kind = expr[0]
    if kind == "dim":
        t, axis = inputs[expr[1]], expr[2]
        static = t.shape[axis]
        return int(static) if static is not None else tf.shape(t, out_type=tf.int64)[axis]
    a, b = _eval(expr[1], inputs), _eval(expr[2], inputs)
    if isinstance(a, int) and isinstance(b, int):
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0,
                "min": min(a, b), "max": max(a, b)}[kind]
    a, b = tf.cast(a, tf.int64), tf.cast(b, tf.int64)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: tf.math.floordiv(a, b),
            "%": lambda: tf.math.floormod(a, b), "min": lambda: tf.minimum(a, b),
            "max": lambda: tf.maximum(a, b)}[kind]()
