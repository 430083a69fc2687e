"""The Python API: TVM modules and their functions as TensorFlow ops."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Union

import tensorflow as tf

from tf_op import _library

#: What ``output_shape`` accepts: a list of non-negative ints, or None for the
#: shape of the first input.
ShapeLike = Union[Sequence[int], tf.TensorShape, None]
#: What ``output_dtype`` accepts: a ``tf.DType``, a dtype name, or None for the
#: dtype of the first input.
DTypeLike = Union[tf.DType, str, None]


class Module:
    """A TVM module: a library made by TVM's ``export_library``, or any library
    exporting TVM-FFI functions.

    The library is loaded by the op, once per process per path, when a function of
    it first runs; a missing or bad library is reported then, as a
    ``tf.errors.OpError`` naming the path.
    """

    def __init__(self, lib_path: str | os.PathLike[str]) -> None:
        self.lib_path = os.path.abspath(os.fspath(lib_path))

    def func(
        self,
        name: str,
        output_shape: ShapeLike = None,
        output_dtype: DTypeLike = None,
        alignment: int = 64,
    ) -> Func:
        """The function ``name`` of the module, as a callable that adds a TVMDSOOp.

        Args:
          name: the function's name in the library.
          output_shape: the output's shape, a list of ints; None means the shape of
            the first input.
          output_dtype: the output's dtype; None means the dtype of the first input.
          alignment: the least alignment in bytes (a power of two) of the buffers
            handed to TVM; misaligned ones are copied through aligned memory.
        """
        return Func(self, name, output_shape, output_dtype, alignment)

    def __getitem__(self, name: str) -> Func:
        return self.func(name)

    def __repr__(self) -> str:
        return f"tf_op.Module({self.lib_path!r})"


#: The name TVM's ``tvm.contrib.tf_op`` gave the same class.
OpModule = Module


class Func:
    """A function of a TVM module. Calling it with tensors adds a TVMDSOOp that
    passes them, then the output TensorFlow allocates, to the TVM function, and
    returns the output."""

    def __init__(
        self,
        module: Module,
        name: str,
        output_shape: ShapeLike,
        output_dtype: DTypeLike,
        alignment: int,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tf_op: function name must be a non-empty string, got {name!r}")
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise ValueError(
                f"tf_op: alignment for {name} in {module.lib_path} must be a power of two, got {alignment!r}"
            )
        self.module = module
        self.name = name
        self.output_shape = _static_shape(output_shape, name, module.lib_path)
        self.output_dtype = None if output_dtype is None else tf.as_dtype(output_dtype)
        self.alignment = alignment

    def __call__(self, *args: Any) -> tf.Tensor:
        inputs = [tf.convert_to_tensor(a) for a in args]
        if self.output_dtype is not None:
            dtype = self.output_dtype
        elif inputs:
            dtype = inputs[0].dtype
        else:
            raise ValueError(
                f"tf_op: {self.name} in {self.module.lib_path} has no input to take the output "
                "dtype from; pass output_dtype"
            )
        if self.output_shape.rank is None and not inputs:
            raise ValueError(
                f"tf_op: {self.name} in {self.module.lib_path} has no input to take the output "
                "shape from; pass output_shape"
            )
        (output,) = _library.load().tvmdso_op(
            args=inputs,
            Tout=[dtype],
            output_shapes=[self.output_shape],
            lib_path=self.module.lib_path,
            func_name=self.name,
            alignment=self.alignment,
        )
        return output

    def __repr__(self) -> str:
        return f"tf_op.Func({self.name!r} of {self.module.lib_path!r})"


def _static_shape(shape: ShapeLike, name: str, lib_path: str) -> tf.TensorShape:
    """The output_shapes attr entry: unknown rank stands for "the first input's"."""
    if shape is None:
        return tf.TensorShape(None)
    dims = list(tf.TensorShape(shape).as_list() if isinstance(shape, tf.TensorShape) else shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(
                f"tf_op: output_shape of {name} in {lib_path} must be a list of ints >= 0, got {shape!r}"
            )
    return tf.TensorShape(dims)
