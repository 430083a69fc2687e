"""``tf_op.auto.convert``: a SavedModel whose TVM-able parts are compiled ahead,
for servers with no TVM compiler (docs/auto.md, "Serving").

As TF-TRT's converter does: the signature's function is frozen (variables
become constants, which TVM then compiles as weights), its graph clustered
as the pass would cluster it (kernels/auto_pass.cc, through
``TVMDSOOpAutoClusterGraphDef``), and run on the example inputs with the
clusters compiling for any x86-64 (the portable libraries), each timed against
TF. Each cluster then takes, beside its inputs, the libraries of the shapes
where TVM won, as assets of the new SavedModel with their digests, and keeps
its function for every other shape.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import convert_to_constants

from tf_op import _library, auto

#: How many calls of one example may go by before each of its shapes is decided:
#: the timing takes 12 (kTimedRuns + 1 of each engine, cluster_kernel.cc).
_MAX_CALLS_PER_EXAMPLE = 20
#: The name of the placeholder that stands for library ``k`` in the clustered graph.
_LIBRARY_INPUT = "tvmdsoop_library_{}"
_IMPORT_SCOPE = "converted"
#: The mark of a cluster's function and its nodes (kClusterFunctionAttr, auto_pass.cc).
_CLUSTER_FUNCTION_ATTR = "_tvmdsoop_cluster"

Example = Mapping[str, Any] | Any


def convert(saved_model_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str],
            example_inputs: Sequence[Example], *, signature_key: str = "serving_default",
            min_cluster_size: int = 2, timing_fallback: bool = True,
            cache_dir: str | os.PathLike[str] | None = None, compile_timeout_s: float = 600.0) -> list[auto.Cluster]:
    """Writes to ``output_dir`` the SavedModel of ``saved_model_dir`` with its
    TVM-able parts compiled for the inputs of ``example_inputs``, and returns
    its clusters (``tf_op.auto.report()``'s records).

    Args:
      saved_model_dir: the SavedModel to convert.
      output_dir: where the converted one goes (its ``assets/`` hold the libraries).
      example_inputs: one entry per input shape to compile for: a dict of the
        signature's inputs by name (a single array where it has one input).
      signature_key: the signature converted; the new SavedModel has it only.
      min_cluster_size, timing_fallback, cache_dir, compile_timeout_s: as
        ``tf_op.auto.enable``'s.

    The converted model needs ``import tf_op`` (the op library) where it loads,
    and no TVM: other shapes than those compiled run TF's ops, unless the pass
    is on there (``tf_op.auto.enable()``, ``TVMDSOOP_AUTO=1``) to compile them.
    """
    if not example_inputs:
        raise ValueError("tf_op.auto.convert: give at least one example input (the shapes to compile for)")
    loaded = tf.saved_model.load(os.fspath(saved_model_dir))
    if signature_key not in loaded.signatures:
        raise ValueError(f"tf_op.auto.convert: {saved_model_dir} has no signature {signature_key!r}; it has "
                         f"{sorted(loaded.signatures)}")
    signature = loaded.signatures[signature_key]
    # Loops stay functional: the loop pass (kernels/auto_loop_pass.cc) takes a
    # While whole, and a lowered loop's frame does not survive the import of
    # the converted graph (its control dependencies leave the frame).
    frozen = convert_to_constants.convert_variables_to_constants_v2(signature, lower_control_flow=False)
    _, input_specs = signature.structured_input_signature
    names = sorted(input_specs)  # the order of the signature's flat inputs
    specs = [tf.TensorSpec(input_specs[n].shape, input_specs[n].dtype, name=n) for n in names]
    input_tensors = [t.name for t in frozen.inputs]
    output_keys = sorted(signature.structured_outputs)
    output_tensors = [t.name for t in frozen.outputs]
    examples = [_example(e, names, specs) for e in example_inputs]

    previous = auto._options()
    # The pass's options as convert's, for the portable libraries a SavedModel
    # carries; a cluster is made here already, and the pass, on while the
    # examples run, must not cut the graph around it again (no cluster is
    # that large). The options in force come back after.
    auto._configure({"enabled": True, "min_cluster_size": 2**31 - 1, "timing_fallback": timing_fallback,
                     "wait": True, "max_shapes": len(examples), "compile_timeout_s": float(compile_timeout_s),
                     "cache_dir": os.fspath(cache_dir) if cache_dir is not None else "",
                     "python": previous.get("python") or sys.executable, "target": "portable"})
    try:
        clustered = cluster_graph_def(_constant_reads(frozen.graph.as_graph_def()), min_cluster_size)
        for function in clustered.library.function:
            # TF's SavedModel loader refuses functions with attrs it does not
            # know; the nodes of a cluster's function carry the mark too, which
            # keeps the pass out of them.
            function.attr.pop(_CLUSTER_FUNCTION_ATTR, None)
            # Called by no op TF knows as a call: registered for the runs here.
            context.context().add_function_def(function)
        records = _compile(clustered, input_tensors, output_tensors, specs, examples)
    finally:
        auto._configure(previous)
    libraries = _with_libraries(clustered, records)

    module = tf.Module()
    module.libraries = [tf.saved_model.Asset(path) for path in libraries]

    @tf.function(input_signature=specs)
    def serve(*args: tf.Tensor) -> dict[str, tf.Tensor]:
        # tf.identity captures the asset's path: the saved function reads the
        # path of the loaded model's copy.
        extra = {f"{_LIBRARY_INPUT.format(k)}:0": tf.identity(asset.asset_path)
                 for k, asset in enumerate(module.libraries)}
        outputs = _import(clustered, input_tensors, output_tensors, args, extra)
        return dict(zip(output_keys, outputs))

    module.serve = serve
    tf.saved_model.save(module, os.fspath(output_dir), signatures={signature_key: serve.get_concrete_function()})
    return list(records.values())


def cluster_graph_def(graph_def: graph_pb2.GraphDef, min_cluster_size: int = 2) -> graph_pb2.GraphDef:
    """``graph_def`` clustered as the pass clusters graphs, all on the CPU."""
    clusterer = _library.c_function(
        "TVMDSOOpAutoClusterGraphDef",
        (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
         ctypes.POINTER(ctypes.c_void_p)),
        ctypes.c_void_p)
    data = graph_def.SerializeToString()
    size, error = ctypes.c_size_t(0), ctypes.c_void_p(None)
    out = clusterer(data, len(data), min_cluster_size, ctypes.byref(size), ctypes.byref(error))
    if not out:
        raise ValueError(_library.take_string(error.value))
    return graph_pb2.GraphDef.FromString(_library.take_bytes(out, size.value))


def _constant_reads(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """``graph_def`` with each chain of identities that reads a constant (what
    freezing makes of a variable's reads) made a constant itself: the pass
    copies constants into a cluster, where TVM compiles them as weights, but
    takes an identity with control inputs for an input of the cluster."""
    nodes = {n.name: n for n in graph_def.node}

    def constant_read(node: node_def_pb2.NodeDef) -> node_def_pb2.NodeDef | None:
        seen = set()
        while node.op == "Identity" and node.name not in seen:
            seen.add(node.name)
            data = [i for i in node.input if not i.startswith("^")]
            if len(data) != 1 or data[0] not in nodes:  # one input, output 0 of its node
                return None
            node = nodes[data[0]]
        return node if node.op == "Const" else None

    folded = graph_pb2.GraphDef()
    folded.CopyFrom(graph_def)
    for node in folded.node:
        constant = constant_read(node) if node.op == "Identity" else None
        if constant is not None:
            name, device = node.name, node.device
            node.CopyFrom(constant)
            node.name, node.device = name, device
    return folded


def _example(example: Example, names: list[str], specs: list[tf.TensorSpec]) -> list[tf.Tensor]:
    """One example's inputs, in the signature's order."""
    if not isinstance(example, Mapping):
        if len(names) != 1:
            raise ValueError(f"tf_op.auto.convert: the signature takes {names}: give each example as a dict")
        example = {names[0]: example}
    if sorted(example) != names:
        raise ValueError(f"tf_op.auto.convert: an example has inputs {sorted(example)}; the signature takes {names}")
    tensors = []
    for name, spec in zip(names, specs):
        value = tf.convert_to_tensor(np.asarray(example[name]), dtype=spec.dtype)
        if not spec.shape.is_compatible_with(value.shape):
            raise ValueError(f"tf_op.auto.convert: example input {name!r} has shape {value.shape}; the signature "
                             f"takes {spec.shape}")
        tensors.append(value)
    return tensors


def _import(graph_def: graph_pb2.GraphDef, input_tensors: list[str], output_tensors: list[str],
            args: Sequence[tf.Tensor], extra: Mapping[str, tf.Tensor]) -> list[tf.Tensor]:
    input_map = {**dict(zip(input_tensors, args)), **extra}
    return tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=output_tensors,
                                          name=_IMPORT_SCOPE)


def _compile(clustered: graph_pb2.GraphDef, input_tensors: list[str], output_tensors: list[str],
             specs: list[tf.TensorSpec], examples: list[list[tf.Tensor]]) -> dict[str, auto.Cluster]:
    """Runs the clustered graph on each example until each of its clusters'
    shapes is decided (compiled, then timed against TF); returns the report's
    records of the clusters, by name."""
    names = {n.attr["cluster"].s.decode() for n in clustered.node if n.op == "TVMDSOOpCluster"}

    @tf.function(input_signature=specs)
    def run(*args: tf.Tensor) -> list[tf.Tensor]:
        return _import(clustered, input_tensors, output_tensors, args, {})

    def ours() -> dict[str, auto.Cluster]:
        return {c.name: c for c in auto.report() if c.name in names}

    for example in examples:
        for _ in range(_MAX_CALLS_PER_EXAMPLE):
            run(*example)
            if not any(s.status == "timing" for c in ours().values() for s in c.shape_records):
                break
    return ours()


def _with_libraries(clustered: graph_pb2.GraphDef, records: Mapping[str, auto.Cluster]) -> list[str]:
    """Gives each cluster of ``clustered`` the libraries of its shapes that run
    TVM, as inputs from placeholders (one per library file, which the saved
    function feeds from its asset); returns the files, in placeholder order."""
    libraries: list[str] = []
    placeholders = []
    for node in clustered.node:
        if node.op != "TVMDSOOpCluster" or node.attr["cluster"].s.decode() not in records:
            continue
        kept = [s for s in records[node.attr["cluster"].s.decode()].shape_records if s.status == "tvm" and s.library]
        for shape in kept:
            if shape.library not in libraries:
                libraries.append(shape.library)
                placeholder = node_def_pb2.NodeDef(name=_LIBRARY_INPUT.format(len(libraries) - 1), op="Placeholder")
                placeholder.attr["dtype"].type = types_pb2.DT_STRING
                placeholder.attr["shape"].shape.SetInParent()  # a scalar
                placeholders.append(placeholder)
            node.input.append(_LIBRARY_INPUT.format(libraries.index(shape.library)))
        node.attr["Nlib"].i = len(kept)
        node.attr["library_sha256"].CopyFrom(attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(s=[s.sha256.encode() for s in kept])))
        node.attr["library_shapes"].CopyFrom(attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(s=[s.shape.encode() for s in kept])))
    clustered.node.extend(placeholders)
    return libraries
