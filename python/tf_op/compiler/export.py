"""A saved model compiled into a SavedModel that runs it on TVM (``tvmdsoop
compile``): the model is read (a SavedModel's signature, or a Keras file),
compiled by ``tf_op.compile`` for the batch sizes asked, and saved with its
libraries as assets, as docs/compiler.md ("SavedModels, TF Serving, Go") shows.
The SavedModel written keeps the signature's name, inputs and outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tf_op.compiler.api import compile as tvm_compile
from tf_op.compiler.targets import Target
from tf_op.module import file_sha256

#: The signature key of the SavedModel written for a Keras file.
KERAS_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class CompiledShape:
    """One library of the SavedModel written: the input shapes it runs."""
    shapes: list[list[int]]
    library: str
    sha256: str


def export(model_path: str | os.PathLike[str], output_dir: str | os.PathLike[str], *, batch_sizes: Sequence[int],
           signature_key: str = "serving_default", target: Target | None = None, tune: bool | int = False,
           cache_dir: str | os.PathLike[str] | None = None) -> list[CompiledShape]:
    """Compiles the model at ``model_path`` (a SavedModel folder, or a ``.keras``
    or ``.h5`` file) for ``batch_sizes`` and writes the SavedModel that runs it
    to ``output_dir``; the libraries it holds."""
    fn, specs, key = _read(Path(model_path), signature_key)
    compiled = tvm_compile(fn, specs, batch_sizes=batch_sizes, target=target, cache_dir=cache_dir, tune=tune)
    serving = tf.Module()
    serving.compiled = compiled
    serving.serve = tf.function(lambda *args: compiled(*args), input_signature=specs)
    tf.saved_model.save(serving, os.fspath(output_dir), signatures={key: serving.serve.get_concrete_function()})
    assets = Path(output_dir) / "assets"
    return [CompiledShape([list(s) for s in shapes], str(assets / path.name if (assets / path.name).is_file()
                                                          else path), file_sha256(path))
            for shapes, path in compiled.library_paths.items()]


def _read(path: Path, signature_key: str) -> tuple[Callable[..., Any], list[tf.TensorSpec], str]:
    """The function to compile, its input specs (named as the model names its
    inputs) and the signature key to save it under. Its outputs are a dict, as
    a serving signature's are."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        if path.suffix not in (".keras", ".h5"):
            raise ValueError(f"{path} is neither a SavedModel folder nor a Keras file (.keras, .h5)")
        model = keras.models.load_model(path, compile=False)
        specs = [tf.TensorSpec(t.shape, t.dtype, name=t.name) for t in model.inputs]  # Input(name=)
        names = list(model.output_names) if len(model.output_names) == len(model.outputs) else \
            [f"output_{i}" for i in range(len(model.outputs))]

        def keras_call(*args: tf.Tensor) -> dict[str, tf.Tensor]:
            outputs = model(list(args) if len(args) > 1 else args[0], training=False)
            return dict(zip(names, tf.nest.flatten(outputs)))

        return keras_call, specs, KERAS_SIGNATURE
    if not (path / "saved_model.pb").is_file():
        raise ValueError(f"{path} is a folder with no saved_model.pb: not a SavedModel")
    loaded = tf.saved_model.load(os.fspath(path))
    if signature_key not in loaded.signatures:
        raise ValueError(f"{path} has no signature {signature_key!r}; it has {sorted(loaded.signatures)}")
    signature = loaded.signatures[signature_key]
    _, inputs = signature.structured_input_signature
    names = sorted(inputs)
    specs = [tf.TensorSpec(inputs[n].shape, inputs[n].dtype, name=n) for n in names]

    def signature_call(*args: tf.Tensor) -> dict[str, tf.Tensor]:
        return signature(**dict(zip(names, args)))

    signature_call.loaded = loaded  # type: ignore[attr-defined]  # the variables live as long as the call
    return signature_call, specs, signature_key

