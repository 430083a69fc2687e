"""A Keras layer over a function of a whole model compiled by TVM."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_op.module import DTypeLike, Module, ShapeLike


class ModelLayer(keras.layers.Layer):
    """Runs function ``function`` of a whole model (a Relax VM executable made by
    ``tvm.compile`` + ``export_library``) as a Keras layer.

    Models whose weights are baked into the library (TVM's TFLite and ONNX
    frontends) need nothing more; models whose weights are inputs
    (``relax.frontend.nn``'s ``export_tvm``) get them as ``params``, in the order
    the function takes them after the layer's inputs. They become weights of the
    layer (trainable with ``grad``), saved with it. The library travels with
    SavedModels made by ``tf.saved_model.save`` (see docs/serving.md).

    With ``grad``, the layer trains: the params become trainable weights, and
    Keras's optimizer updates them with the gradients the model's function
    ``grad`` computes (``tf_op_tvm.add_gradient`` makes one; docs/usage.md,
    "Training").

    Args:
      lib_path: the model's library.
      function: the function to call (``Module(lib_path).functions()`` lists them).
      params: arrays passed after the inputs, as layer weights.
      output_shapes: one shape per output (see ``Module.func``: ints, with None
        for a dimension not checked, such as the batch). Required: Keras needs
        each output's rank to build a model, and a model's library does not say.
      output_dtypes: one dtype per output; by default the first input's.
      grad: the model's function giving the gradient of ``function``, called
        with the inputs, the params, the outputs and the upstream gradients; it
        returns one gradient per floating-point input and param.
    """

    def __init__(
        self,
        lib_path: str | os.PathLike[str],
        function: str = "main",
        *,
        output_shapes: Sequence[ShapeLike],
        params: Sequence[Any] = (),
        output_dtypes: Sequence[DTypeLike] | None = None,
        grad: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Keras's jit_compile="auto" turns XLA on where a GPU is, unless a layer
        # says no: XLA cannot compile custom ops.
        self.supports_jit = False
        self.module = Module(lib_path)
        if any(shape is None for shape in output_shapes):
            raise ValueError(f"tf_op: ModelLayer of {lib_path}: every output needs a shape (Keras needs its rank), got {output_shapes}")
        if not self.module.is_model:
            raise ValueError(f"tf_op: {self.module.lib_path} is not a whole model (a Relax VM executable)")
        self.fn = self.module.func(function, output_shapes=output_shapes, output_dtypes=output_dtypes, grad=grad)
        self.model_params = []
        for i, value in enumerate(params):
            array = np.asarray(value)
            self.model_params.append(
                self.add_weight(
                    name=f"param_{i}",
                    shape=array.shape,
                    dtype=str(array.dtype),
                    initializer=lambda shape, dtype, array=array: tf.constant(array, dtype=dtype),
                    trainable=grad is not None,
                )
            )

    def call(self, *inputs: tf.Tensor) -> tf.Tensor | tuple[tf.Tensor, ...]:
        outputs = self.fn(*inputs, *[tf.convert_to_tensor(p) for p in self.model_params])
        return outputs[0] if isinstance(outputs, tuple) and len(outputs) == 1 else outputs
