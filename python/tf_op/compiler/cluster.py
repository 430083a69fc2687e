"""The compiles of tf_op.auto's clusters, run by the op library
(auto/worker.go) in a process of its own, kept for the next compiles:

    python -m tf_op.compiler.cluster

reads one request a line on stdin, ``{"name": N, "function": F.pb, "inputs":
[{"dtype": TF DataType, "shape": [...]}, ...], "cache_dir": D, "target": T}``,
and answers each with one line on stdout (everything else it and TF print goes
to stderr); it ends at the end of stdin.

``F.pb`` is a FunctionDefLibrary: the cluster's function as a pass made it
(kernels/auto_pass.cc, after TF's grappler; or kernels/auto_loop_pass.cc, a
whole loop, before it), then the functions it calls (a loop's cond and body).
Its fused ops (``_FusedConv2D`` and the like) are taken
apart into the ops TF's TFLite converter knows, and the function is traced for
the inputs' static shapes, then compiled as ``tf_op.compile`` compiles (the
TFLite converter, the TVM worker, the same cache) for this machine's CPU, or
(``"target": "portable"``, for tf_op.auto.convert) for any x86-64. The answer is
``tvmdsoop-cluster: {"library": ..., "sha256": ..., "flops": ...}`` (``flops``:
the part's convolutions' and matmuls', flops.py), or ``tvmdsoop-cluster-error:
"..."`` with why it failed. A process that stays saves each compile after the
first the start of Python and TensorFlow (about 3 s): a cache hit then takes
the tracing only.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import function_def_to_graph

from tf_op.compiler import cache, flops, tflite_conversion, unroll
from tf_op.compiler.compiled_function import _library
from tf_op.compiler.errors import CompileError
from tf_op.compiler.progress import Progress
from tf_op.compiler.targets import HOST_TARGET

#: The prefixes of the answer's line: the library, or why there is none.
RESULT_PREFIX = "tvmdsoop-cluster: "
ERROR_PREFIX = "tvmdsoop-cluster-error: "

#: The fused ops grappler's remapper makes, and the op each starts with.
_FUSED_BASE = {"_FusedConv2D": "Conv2D", "_FusedDepthwiseConv2dNative": "DepthwiseConv2dNative",
               "_FusedMatMul": "MatMul"}
#: The attrs of a fused op that are the fusion's, not the base op's.
_FUSION_ATTRS = ("fused_ops", "num_args", "epsilon", "leakyrelu_alpha", "num_host_args", "filter_format")
#: The fused activations, as the op each is on its own.
_ACTIVATIONS = {"Relu": "Relu", "Relu6": "Relu6", "Elu": "Elu", "LeakyRelu": "LeakyRelu", "Tanh": "Tanh",
                "Sigmoid": "Sigmoid"}


def unfuse(graph_def: graph_pb2.GraphDef) -> None:
    """Rewrites each fused op of grappler into its steps (base op, bias add or
    batch norm, add, activation; oneDNN's swish into x * sigmoid(x); Erfc and
    Erf, which TFLite lacks, into ops it has), the last
    step keeping the node's name so that its consumers need no change; and drops
    the attrs TF's runtime added to the nodes (``_class`` colocations with nodes
    outside the cluster, the pass's own mark), which the cluster's graph on its
    own cannot honour."""
    nodes = []
    for node in graph_def.node:
        for key in [k for k in node.attr if k.startswith("_")]:
            del node.attr[key]
        if node.op == "_MklSwish":
            nodes.extend(_swish(node))
        elif node.op == "Erfc":
            nodes.extend(_erfc(node))
        elif node.op == "Erf":
            nodes.extend(_erf(node))
        elif node.op in _FUSED_BASE:
            nodes.extend(_steps(node))
        else:
            nodes.append(node)
    del graph_def.node[:]
    graph_def.node.extend(nodes)


class _Steps:
    """The nodes one node is rewritten into, each named under it, on its device
    and of its dtype; the last takes the node's name (``nodes()``), so that its
    consumers need no change."""

    def __init__(self, node: node_def_pb2.NodeDef) -> None:
        self.node = node
        self.dtype = node.attr["T"]
        self.controls = [i for i in node.input if i.startswith("^")]
        self._nodes: list[node_def_pb2.NodeDef] = []

    def _add(self, op: str) -> node_def_pb2.NodeDef:
        made = node_def_pb2.NodeDef(name=f"{self.node.name}/tvmdsoop_{len(self._nodes)}_{op}", op=op,
                                    device=self.node.device)
        self._nodes.append(made)
        return made

    def op(self, op: str, *inputs: str, **attrs: Any) -> str:
        """A step ``op`` of ``inputs`` with attrs ``attrs`` (``T`` is the node's)."""
        made = self._add(op)
        made.input.extend(inputs)
        made.attr["T"].CopyFrom(self.dtype)
        for key, value in attrs.items():
            made.attr[key].CopyFrom(value)
        return made.name

    def const(self, value: float) -> str:
        """A scalar constant of the node's dtype."""
        made = self._add("Const")
        made.attr["dtype"].type = self.dtype.type
        made.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, tf.as_dtype(self.dtype.type)))
        return made.name

    def nodes(self) -> list[node_def_pb2.NodeDef]:
        self._nodes[-1].name = self.node.name
        return self._nodes


def _steps(node: node_def_pb2.NodeDef) -> list[node_def_pb2.NodeDef]:
    fused = [s.decode() for s in node.attr["fused_ops"].list.s]
    steps = _Steps(node)
    args = [i for i in node.input[2:] if not i.startswith("^")]
    out = steps.op(_FUSED_BASE[node.op], *node.input[:2], *steps.controls,
                   **{key: value for key, value in node.attr.items() if key not in _FUSION_ATTRS})
    rest = list(fused)
    if rest and rest[0] == "BiasAdd":
        out = steps.op("BiasAdd", out, args.pop(0),
                       **({"data_format": node.attr["data_format"]} if "data_format" in node.attr else {}))
        rest.pop(0)
    elif rest and rest[0] == "FusedBatchNorm":
        scale, offset, mean, variance = args[:4]
        args = args[4:]
        out = steps.op("FusedBatchNormV3", out, scale, offset, mean, variance, epsilon=node.attr["epsilon"],
                       U=steps.dtype, is_training=attr_value_pb2.AttrValue(b=False),
                       data_format=node.attr.get("data_format", attr_value_pb2.AttrValue(s=b"NHWC")))
        rest.pop(0)
    if rest and rest[0] == "Add":
        out = steps.op("AddV2", out, args.pop(0))
        rest.pop(0)
    for activation in rest:
        if activation in _ACTIVATIONS:
            extra = {"alpha": node.attr["leakyrelu_alpha"]} if activation == "LeakyRelu" else {}
            out = steps.op(_ACTIVATIONS[activation], out, **extra)
        elif activation == "GeluExact":
            out = _gelu_exact(steps, out)
        else:
            raise CompileError(f"{node.name}: {node.op} fuses {fused}, which this compiler cannot take apart")
    return steps.nodes()


def _gelu_exact(steps: _Steps, x: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2)), as Keras's exact GELU."""
    one_plus = steps.op("AddV2", steps.op("Erf", steps.op("Mul", x, steps.const(0.7071067811865476))), steps.const(1.0))
    return steps.op("Mul", steps.op("Mul", x, steps.const(0.5)), one_plus)


def _swish(node: node_def_pb2.NodeDef) -> list[node_def_pb2.NodeDef]:
    """x * sigmoid(x): what oneDNN's ``_MklSwish`` computes, in ops TFLite knows."""
    steps = _Steps(node)
    x = node.input[0]
    steps.op("Mul", x, steps.op("Sigmoid", x), *steps.controls)
    return steps.nodes()


#: Abramowitz and Stegun 7.1.26: erfc(a) = t (a1 + t (a2 + ...)) exp(-a^2) with
#: t = 1 / (1 + p a), for a >= 0, within 1.5e-7.
_ERFC_P = 0.3275911
_ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erfc(node: node_def_pb2.NodeDef) -> list[node_def_pb2.NodeDef]:
    """erfc(z) from ops TF's TFLite converter takes, which has no Erfc (and Erf
    only inside GELU's exact pattern, which grappler's reassociated products
    hide). Within 1.5e-7 of erfc: float32 noise for Keras 3's exact GELU, 0.5 x
    erfc(-x / sqrt 2), the Erfc TF graphs hold."""
    steps = _Steps(node)
    _erfc_of(steps, node.input[0])
    return steps.nodes()


def _erf(node: node_def_pb2.NodeDef) -> list[node_def_pb2.NodeDef]:
    """erf(z) = 1 - erfc(z) (_erfc), for an Erf outside GELU's pattern, which
    TFLite's converter refuses."""
    steps = _Steps(node)
    steps.op("Sub", steps.const(1.0), _erfc_of(steps, node.input[0]), *steps.controls)
    return steps.nodes()


def _erfc_of(steps: _Steps, z: str) -> str:
    """The steps of erfc(z): Abramowitz and Stegun's 7.1.26 for |z|, and
    2 - erfc(|z|) for z < 0; the controls of the node go on the last."""
    a = steps.op("Abs", z)
    t = steps.op("RealDiv", steps.const(1.0), steps.op("AddV2", steps.const(1.0),
                                                       steps.op("Mul", a, steps.const(_ERFC_P))))
    poly = steps.const(_ERFC_A[-1])
    for coefficient in reversed(_ERFC_A[:-1]):
        poly = steps.op("AddV2", steps.const(coefficient), steps.op("Mul", t, poly))
    tail = steps.op("Mul", steps.op("Mul", t, poly), steps.op("Exp", steps.op("Neg", steps.op("Square", a))))
    non_negative = steps.op("GreaterEqual", z, steps.const(0.0))
    return steps.op("SelectV2", non_negative, tail, steps.op("Sub", steps.const(2.0), tail), *steps.controls)


def concrete_function(fdef: function_pb2.FunctionDef, inputs: Sequence[dict[str, Any]],
                      called: Sequence[function_pb2.FunctionDef] = ()) -> Any:
    """The cluster's function as a ConcreteFunction of its inputs (named
    ``input_0``...), its fused ops taken apart and its loops of few steps
    unrolled (unroll.py), for these static shapes; ``called``: the functions
    it calls."""
    shapes = [tf.TensorShape(spec["shape"]) for spec in inputs]
    # TF looks the called functions up where the graph is made: a graph of
    # their own, not the process's eager context (the next request's may have
    # the same names).
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=function_pb2.FunctionDefLibrary(function=called)))
        graph_def, names = function_def_to_graph.function_def_to_graph_def(fdef, input_shapes=shapes)
    unfuse(graph_def)
    graph_def.library.function.extend(called)
    specs = [tf.TensorSpec(spec["shape"], tf.as_dtype(spec["dtype"]), name=f"input_{i}")
             for i, spec in enumerate(inputs)]
    renamed = unroll.unroll(graph_def, {arg.name: spec for arg, spec in zip(fdef.signature.input_arg, specs)})
    arg_names = [f"{arg.name}:0" for arg in fdef.signature.input_arg]
    out_names = unroll.rename([names[fdef.ret[arg.name]] for arg in fdef.signature.output_arg], renamed)
    return unroll.function_of(graph_def, arg_names, out_names, specs, scope="cluster")


def compile_cluster(name: str, library: function_pb2.FunctionDefLibrary, inputs: Sequence[dict[str, Any]],
                    cache_dir: str | None, target: str = HOST_TARGET) -> dict[str, Any]:
    """The library of the cluster (``library``'s first function, calling the
    others) for these inputs, from the cache or compiled now for ``target``:
    its path, its sha256 and the part's FLOPs."""
    if not library.function:
        raise CompileError(f"{name}: the request holds no function")
    concrete = concrete_function(library.function[0], inputs, library.function[1:])
    fingerprint = tflite_conversion.fingerprint(concrete)
    # The pass's compiles run unseen: their stages go to the log only.
    with Progress(name, after_s=float("inf")) as progress:
        lib_path, digest = _library(fingerprint.digest, lambda: tflite_conversion.to_tflite(concrete, name),
                                    target, 0, cache.folder(cache_dir), progress)
    return {"library": str(lib_path), "sha256": digest, "flops": flops.conv_matmul_flops(concrete.graph)}


def answer(request: dict[str, Any]) -> str:
    """The answer line to one request."""
    try:
        with open(request["function"], "rb") as f:
            library = function_pb2.FunctionDefLibrary.FromString(f.read())
        compiled = compile_cluster(request["name"], library, request["inputs"], request.get("cache_dir") or None,
                                   request.get("target") or HOST_TARGET)
    except Exception as err:  # noqa: BLE001  (each way a cluster fails to compile is one answer: TF runs it)
        logging.getLogger(__package__).debug("compile failed", exc_info=True)
        return ERROR_PREFIX + json.dumps(f"{type(err).__name__}: {err}")
    return RESULT_PREFIX + json.dumps(compiled)


def serve(requests: TextIO, answers: TextIO) -> None:
    """Answers each request line of ``requests`` on ``answers``, to their end."""
    for line in requests:
        if line.strip():
            answers.write(answer(json.loads(line)) + "\n")
            answers.flush()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    # The answers alone on stdout: what else writes there (TF's and TVM's own
    # prints, from Python or C++) goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
