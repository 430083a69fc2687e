"""TF -> TFLite: a traced function frozen into the flatbuffer TVM's frontend reads."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_op.compiler.errors import CompileError


def to_tflite(concrete: Any, name: str) -> bytes:
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
