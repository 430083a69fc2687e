"""The floating-point operations of a TF graph's convolutions and matmuls, from
its static shapes: what tf_op.auto's report counts for each compiled part
(cluster.py), and what ``make bench`` compares them with for a whole model (the
share of a model's work that runs on TVM). A multiply-add counts as two."""

from __future__ import annotations

import math

import tensorflow as tf

_CONVOLUTIONS = {"Conv2D", "_FusedConv2D"}
_DEPTHWISE = {"DepthwiseConv2dNative", "_FusedDepthwiseConv2dNative"}
_MATMULS = {"MatMul", "_FusedMatMul"}
_BATCH_MATMULS = {"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}


def conv_matmul_flops(graph: tf.Graph) -> int:
    """The FLOPs of ``graph``'s own convolutions and matmuls (not those of the
    functions it calls); an op whose shapes are not all static counts 0."""
    return sum(op_flops(op) for op in graph.get_operations())


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
