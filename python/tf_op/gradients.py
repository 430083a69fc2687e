"""The gradient of TVMDSOOp: TensorFlow differentiates through a TVM function by
calling the function's gradient, another TVM function the op names in its attrs.

A function made with ``Module.func(..., grad=...)`` records its gradient in the
graph: ``grad_func`` (the name), ``grad_returns`` (whether it returns its outputs)
and, for a gradient in another library, that library as the second element of the
op's ``library`` input (so a SavedModel carries it as an asset) with its SHA-256 in
``grad_lib_sha256``. Registered when tf_op is imported, so a loaded SavedModel
trains after ``import tf_op``, as it runs after it.

The gradient function's contract: ``grad(*inputs, *outputs, *upstream_grads)``
gives one gradient per floating-point or complex input, in input order, each
shaped like its input; a ``None`` upstream gradient is passed as zeros.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_op import _library


def _differentiable(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


def _attr(op: Any, name: str) -> Any:
    value = op.get_attr(name)
    return value.decode() if isinstance(value, bytes) else value


def _no_gradient(func_name: str, library: tf.Tensor) -> LookupError:
    """TensorFlow's own error for an op without a gradient is a LookupError; this
    one says which function and what to do. The library is named where the graph
    knows its path (eager calls, constants)."""
    path = tf.get_static_value(library)
    where = ""
    if path is not None:
        first = np.asarray(path).reshape(-1)[0]
        where = f" of {first.decode() if isinstance(first, bytes) else first}"
    return LookupError(
        f"tf_op: function {func_name!r}{where} has no gradient, so TensorFlow cannot differentiate through it. "
        f"Give it one with Module.func({func_name!r}, ..., grad=...): a function taking (*inputs, *outputs, "
        "*upstream_grads) and giving one gradient per floating-point input (docs/usage.md, \"Training\"); "
        "or keep it off the path with tf.stop_gradient."
    )


def _declared_outputs(
    func_name: str, grad_name: str, inputs: dict[int, tf.Tensor], returns: bool
) -> tuple[list[tf.TensorShape], list[tf.Tensor]]:
    """The gradient op's output_shapes and output_dims for the gradients of inputs
    (by input index), each shaped like its input. A returning gradient's shapes are
    checked against what is known of the input's; a destination-passing one's sizes
    are the input's, read at run time where the graph does not know them."""
    if returns:
        return [x.shape for x in inputs.values()], []
    shapes, dims = [], []
    for index, x in inputs.items():
        if x.shape.is_fully_defined():
            shapes.append(x.shape)
        elif x.shape.rank is not None:
            shapes.append(tf.TensorShape([None] * x.shape.rank))
            dims.append(tf.shape(x, out_type=tf.int64))
        elif index == 0:
            shapes.append(tf.TensorShape(None))  # the op's "first input's shape", at run time
        else:
            raise ValueError(
                f"tf_op: gradient {grad_name!r} of function {func_name!r}: input {index} has an unknown rank, so "
                "the shape of its gradient cannot be declared; give the input a known rank"
            )
    return shapes, dims


@tf.RegisterGradient("TVMDSOOp")
def _tvmdso_op_grad(op: Any, *upstream: tf.Tensor | None) -> list[tf.Tensor | None]:
    func_name = _attr(op, "func_name")
    num_args = len(op.get_attr("Tin"))
    args = list(op.inputs[:num_args])
    library = op.inputs[-1]
    grad_name = _attr(op, "grad_func")
    if not grad_name:
        raise _no_gradient(func_name, library)
    if library.shape.rank == 1:
        grad_library, grad_sha256 = library[1], _attr(op, "grad_lib_sha256")
    else:
        grad_library, grad_sha256 = library, _attr(op, "lib_sha256")
    wanted = {k: x for k, x in enumerate(args) if _differentiable(x.dtype)}
    if not wanted:  # tf.gradients asked about integer inputs only
        return [None] * len(op.inputs)
    outputs = list(op.outputs)
    upstream_grads = [
        tf.zeros_like(out) if g is None else tf.convert_to_tensor(g, dtype=out.dtype)
        for out, g in zip(outputs, upstream)
    ]
    returns = bool(op.get_attr("grad_returns"))
    shapes, output_dims = _declared_outputs(func_name, grad_name, wanted, returns)
    grads = _library.load().tvmdso_op(
        args=[*args, *outputs, *upstream_grads],
        output_dims=output_dims,
        library=grad_library,
        Tout=[x.dtype for x in wanted.values()],
        output_shapes=shapes,
        func_name=grad_name,
        lib_sha256=grad_sha256,
        alignment=op.get_attr("alignment"),
        returns=returns,
    )
    result: list[tf.Tensor | None] = [None] * len(op.inputs)
    for (k, x), g in zip(wanted.items(), grads):
        if not tf.executing_eagerly():
            g.set_shape(x.shape)  # what the graph knows of the input, it knows of the gradient
        result[k] = g
    return result
