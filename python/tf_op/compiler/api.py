"""``tf_op.compile``: its arguments checked, the defaults chosen, a
``CompiledFunction`` made (and compiled now for the batch sizes named)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_op.compiler import cache, targets
from tf_op.compiler.compiled_function import CompiledFunction
from tf_op.compiler.targets import DEFAULT_TARGET, HOST_TARGET, PORTABLE_TARGET, Target

#: The trials ``tune=True`` gives MetaSchedule, shared among the model's kernels:
#: a few minutes on a small model, 7 on MobileNetV2 at batch 1 (2 Zen 4 CPUs).
DEFAULT_TUNING_TRIALS = 1000


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
      target: a TVM target (its string or dict form), ``"native"`` for this
        machine's CPU, or ``"portable"``: every x86-64 level in one library,
        the op using the highest the CPU has. Default ``"portable"``, or
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
    kind = targets.kind(target)
    if kind not in ("llvm", "cuda"):
        raise ValueError(f"tf_op.compile: the op runs CPU (llvm) and CUDA libraries, got target {target!r}")
    if trials and (kind != "llvm" or target == PORTABLE_TARGET):
        raise ValueError(f"tf_op.compile: tune is for one CPU target (it measures candidates on this machine), "
                         f"got target {target!r}; the default with tune is {HOST_TARGET!r}")
    compiled = CompiledFunction(fn, input_signature, target, cache.folder(cache_dir), trials)
    for batch in batch_sizes:
        compiled.compile_for(compiled.batch_shapes(batch))
    return compiled


def _tuning_trials(tune: bool | int) -> int:
    if tune is True:
        return DEFAULT_TUNING_TRIALS
    if tune is False:
        return 0
    if not isinstance(tune, int) or tune < 0:
        raise ValueError(f"tf_op.compile: tune is True, False or a number of trials >= 0, got {tune!r}")
    return tune
