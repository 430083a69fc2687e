"""The floating-point operations of a TF graph's convolutions and matmuls, from
its static shapes: what tf_op.auto's report counts for each compiled part
(cluster.py), and what ``make bench`` compares them with for a whole model (the
share of a model's work that runs on TVM). A multiply-add counts as two."""

from __future__ import annotations

import math

import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph

_CONVOLUTIONS = {"Conv2D", "_FusedConv2D"}
_DEPTHWISE = {"DepthwiseConv2dNative", "_FusedDepthwiseConv2dNative"}
_MATMULS = {"MatMul", "_FusedMatMul"}
_BATCH_MATMULS = {"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}


_LOOPS = {"While", "StatelessWhile"}
_CALLS = {"PartitionedCall", "StatefulPartitionedCall"}


def conv_matmul_flops(graph: tf.Graph) -> int:
    """The FLOPs of ``graph``'s convolutions and matmuls that its results need,
    with those of the functions it calls, and of its loops' bodies times their
    trip counts (loop_flops). An op whose shapes are not all static counts 0."""
    return sum(_flops(op) for op in _needed(graph))


def _flops(op: tf.Operation) -> int:
    if op.type in _LOOPS:
        return loop_flops(op)
    if op.type in _CALLS:  # a loop unrolled (unroll.py) calls its body at each step
        called = _function_graph(op, "f")
        return conv_matmul_flops(called) if called is not None else 0
    return op_flops(op)


def _needed(graph: tf.Graph) -> list[tf.Operation]:
    """The ops a function's graph runs for its results and its control
    outputs: not what TF prunes (a Keras RNN traces one step ahead of its loop,
    for the shapes alone). All of a graph that names no results."""
    ends = [t.op for t in getattr(graph, "outputs", [])] + list(getattr(graph, "control_outputs", []))
    if not ends:
        return graph.get_operations()
    seen: set[tf.Operation] = set()
    stack = list(ends)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op in seen]


def loop_flops(op: tf.Operation) -> int:
    """A While's: its body's FLOPs times its trip count, which is its
    ``maximum_iterations`` where that is static, else the length of the tensor
    lists it steps through (a Keras RNN's sequence); 0 where neither is known."""
    body = _function_graph(op, "body")
    if body is None:
        return 0
    trips = tf.get_static_value(op.inputs[1])
    if trips is None:
        lengths = [t.op.inputs[0].shape[0] for t in op.inputs if t.op.type == "TensorListFromTensor"]
        trips = min((n for n in lengths if n is not None), default=None)
    return int(trips) * conv_matmul_flops(body) if trips is not None else 0


def _function_graph(op: tf.Operation, attr: str) -> tf.Graph | None:
    """The function of op's attr ``attr`` as a graph: the one TF traced, or one
    made from its FunctionDef for op's input shapes (a graph imported from a
    GraphDef, as the compile worker's, keeps only the FunctionDef); None if
    neither can be had."""
    body = op.graph._get_function(op.get_attr(attr).name)  # noqa: SLF001  (TF's one way to a called function)
    if body is None:
        return None
    if getattr(body, "graph", None) is not None:
        return body.graph
    try:
        return function_def_to_graph.function_def_to_graph(body.definition, input_shapes=[t.shape for t in op.inputs])
    except (ValueError, KeyError, TypeError):  # a body TF itself cannot rebuild: not counted
        return None


def op_flops(op: tf.Operation) -> int:
    """The FLOPs of one convolution or matmul; 0 for any other op, or where a
    shape it needs is not static."""
    if op.type not in _CONVOLUTIONS | _DEPTHWISE | _MATMULS | _BATCH_MATMULS:
        return 0
    out = op.outputs[0].shape
    if not out.is_fully_defined():
        return 0
    outputs = math.prod(out.as_list())
    if op.type in _CONVOLUTIONS | _DEPTHWISE:
        kernel = op.inputs[1].shape  # [height, width, in channels, out channels or multiplier]
        if not kernel[:3].is_fully_defined():
            return 0
        height, width, in_channels = kernel[:3].as_list()
        # Each output of a convolution sums over the window and all its input
        # channels; a depthwise one's, over the window of its one channel.
        per_output = height * width * (in_channels if op.type in _CONVOLUTIONS else 1)
        return 2 * outputs * per_output
    a = op.inputs[0].shape
    if op.type in _MATMULS:
        transposed = op.get_attr("transpose_a")
    else:
        transposed = op.get_attr("adj_x")
    inner = a[-2] if transposed else a[-1]
    return 2 * outputs * inner if inner is not None else 0
