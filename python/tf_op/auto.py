"""``tf_op.auto``: TVM inside any TF graph, automatically.

    import tf_op
    tf_op.auto.enable()      # graphs TF builds from now on run their TVM-able parts on TVM
    y = model.predict(x)     # tf.function, Keras fit/predict, TF1 Session, loaded SavedModels
    tf_op.auto.report()      # the clusters made since enable()
    tf_op.auto.disable()

A graph pass in the op library runs on every graph TF is about to execute: it
finds the parts TVM can take (convolutions and matmuls, with the element-wise
work around them, in float32 on a CPU), and replaces each with one
``TVMDSOOpCluster`` op that keeps the part as a function. The op compiles its
part with TVM at the first call of each input shape (in a process of its own,
through ``tf_op.compile``'s cache), times it against TF on the next calls, and
runs the faster; whatever TVM cannot do runs in TF as before. docs/auto.md.

Graphs TF instantiated before ``enable()`` (a tf.function already called) keep
their form; ``disable()`` stops the pass and sends every cluster back to TF.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tf_op import _library

__all__ = ["Cluster", "ShapeRecord", "convert", "disable", "enable", "report"]


@dataclass(frozen=True)
class ShapeRecord:
    """What became of one input shape of a cluster."""

    shape: str  #: the inputs' shapes, as ``"[1,224,224,3] [64]"``
    status: str  #: ``"timing"`` (being timed against TF), ``"tvm"`` or ``"tf"``
    reason: str  #: why it runs TF; empty otherwise
    compile_seconds: float
    library: str = ""  #: the compiled library's path; empty where none was made
    sha256: str = ""  #: the library's digest
    #: the convolutions' and matmuls' FLOPs of the compiled part for this shape
    #: (a multiply-add is 2); 0 where nothing was compiled
    flops: int = 0


@dataclass(frozen=True)
class Cluster:
    """One cluster the pass made: a record of ``report()``."""

    name: str
    graph: str  #: the function whose graph it was cut from
    ops: list[str]  #: the TF op types in it, e.g. ``"Conv2D"``, ``"MatMul"``
    #: ``"pending"`` before it ran, then that of the shape that ran last:
    #: ``"timing"``, ``"tvm"`` (it runs TVM's code) or ``"tf"`` (it falls back)
    status: str
    reason: str  #: why it falls back to TF; empty otherwise
    compile_seconds: float  #: its shapes' compiles together
    shape_records: list[ShapeRecord] = field(default_factory=list)

    @property
    def shapes(self) -> list[str]:
        """The input shapes seen."""
        return [r.shape for r in self.shape_records]


def enable(*, min_cluster_size: int = 2, timing_fallback: bool = True, cache_dir: str | os.PathLike[str] | None = None,
           wait: bool = True, max_shapes: int = 8, compile_timeout_s: float = 600.0) -> None:
    """Turns the pass on for the graphs TF builds from now on, and starts a new report.

    Args:
      min_cluster_size: the fewest ops a cluster may have (constants and
        identities not counted); smaller parts stay TF's.
      timing_fallback: time each compiled shape against TF on its first runs
        (six calls of each, in turns) and keep TF where TVM's code is slower, so that no
        graph runs slower with the pass on. ``False`` keeps TVM regardless.
      cache_dir: the compile cache, as ``tf_op.compile``'s: default
        ``$TVMDSOOP_CACHE_DIR``, else ``~/.cache/tvmdsoop``.
      wait: the first call of a new input shape waits for its compile (as
        XLA's does); ``False`` runs TF for it until the compile ends.
      max_shapes: the input shapes a cluster compiles; later ones run TF.
      compile_timeout_s: the longest one compile may take; past it, TF.
    """
    _configure({"enabled": True, "min_cluster_size": min_cluster_size, "timing_fallback": timing_fallback,
                "wait": wait, "max_shapes": max_shapes, "compile_timeout_s": float(compile_timeout_s),
                "cache_dir": os.fspath(cache_dir) if cache_dir is not None else "",
                # The clusters compile on this Python: it has TF, tf_op and (for
                # the TVM worker, unless TVMDSOOP_TVM_PYTHON names another) TVM.
                "python": sys.executable})


def disable() -> None:
    """Turns the pass off: graphs built from now on are left alone, and the
    clusters made already run their TF functions."""
    _configure({"enabled": False, "python": sys.executable})


def convert(saved_model_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str],
            example_inputs: Sequence[Any], **options: Any) -> list[Cluster]:
    """Writes a SavedModel whose TVM-able parts are compiled ahead for the
    shapes of ``example_inputs``, for servers with no TVM compiler; returns its
    clusters. ``tf_op.auto_convert.convert`` says more."""
    from tf_op import auto_convert  # it builds on this module

    return auto_convert.convert(saved_model_dir, output_dir, example_inputs, **options)


def report() -> list[Cluster]:
    """The clusters made since the last ``enable()``, in the order made."""
    raw = _library.c_function("TVMDSOOpAutoReport", (), ctypes.c_void_p)()
    records = json.loads(_library.take_string(raw))
    return [_cluster(r) for r in records]


def _cluster(record: dict[str, Any]) -> Cluster:
    shapes = [ShapeRecord(s["shape"], s["status"], s["reason"], s["compile_seconds"], s["library"], s["sha256"],
                          s["flops"]) for s in record["shapes"]]
    return Cluster(record["name"], record["graph"], list(record["ops"] or []), record["status"], record["reason"],
                   record["compile_seconds"], shapes)


def _options() -> dict[str, Any]:
    """The options in force, as ``_configure`` takes them."""
    return json.loads(_library.take_string(_library.c_function("TVMDSOOpAutoOptions", (), ctypes.c_void_p)()))


def _configure(options: dict[str, Any]) -> None:
    configure = _library.c_function("TVMDSOOpAutoConfigure", (ctypes.c_char_p,), ctypes.c_void_p)
    error = _library.take_string(configure(json.dumps(options).encode()))
    if error:
        raise ValueError(error)
