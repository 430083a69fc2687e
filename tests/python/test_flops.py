"""tf_op.compiler.flops: the convolution and matmul FLOPs that tf_op.auto's
report and make bench's coverage count, against the formulas worked by hand."""

from __future__ import annotations

from collections.abc import Callable

import keras
import pytest
import tensorflow as tf

from tf_op.compiler import flops


def _graph(body: Callable[..., tf.Tensor], *specs: tf.TensorSpec) -> tf.Graph:
    return tf.function(body).get_concrete_function(*specs).graph


@pytest.mark.parametrize(("body", "specs", "expected"), [
    # 2 x N x Ho x Wo x Cout x Kh x Kw x Cin
    (lambda x: tf.nn.conv2d(x, tf.ones([3, 3, 4, 8]), 1, "SAME"), [tf.TensorSpec([2, 6, 6, 4])],
     2 * 2 * 6 * 6 * 8 * 3 * 3 * 4),
    (lambda x: tf.nn.conv2d(x, tf.ones([3, 3, 4, 8]), 2, "VALID"), [tf.TensorSpec([1, 7, 7, 4])],
     2 * 1 * 3 * 3 * 8 * 3 * 3 * 4),
    # a depthwise output sums over its window only: 2 x N x Ho x Wo x C*m x Kh x Kw
    (lambda x: tf.nn.depthwise_conv2d(x, tf.ones([3, 3, 4, 2]), [1, 1, 1, 1], "SAME"), [tf.TensorSpec([1, 5, 5, 4])],
     2 * 1 * 5 * 5 * 8 * 3 * 3),
    (lambda a, b: tf.matmul(a, b), [tf.TensorSpec([3, 5]), tf.TensorSpec([5, 7])], 2 * 3 * 7 * 5),
    (lambda a, b: tf.matmul(a, b, transpose_a=True), [tf.TensorSpec([5, 3]), tf.TensorSpec([5, 7])], 2 * 3 * 7 * 5),
    (lambda a, b: tf.matmul(a, b, adjoint_a=True), [tf.TensorSpec([4, 5, 3]), tf.TensorSpec([4, 5, 7])],
     2 * 4 * 3 * 7 * 5),
    (lambda a, b: tf.nn.relu(tf.matmul(a, b)) + tf.matmul(a, b),
     [tf.TensorSpec([2, 3]), tf.TensorSpec([3, 4])], 2 * (2 * 2 * 4 * 3)),
    (lambda a: tf.nn.relu(a) * 2.0, [tf.TensorSpec([8, 8])], 0),
    # an unknown batch: nothing to count
    (lambda x: tf.nn.conv2d(x, tf.ones([3, 3, 4, 8]), 1, "SAME"), [tf.TensorSpec([None, 6, 6, 4])], 0),
    # a loop: its body's, times maximum_iterations
    (lambda a: tf.while_loop(lambda i, v: i < 100, lambda i, v: (i + 1, tf.matmul(v, tf.ones([3, 3]))), (0, a),
                             maximum_iterations=4)[1], [tf.TensorSpec([2, 3])], 4 * 2 * 2 * 3 * 3),
    # an LSTM's: each of its 5 steps multiplies the input (3) and the state (8) by 4 gates' weights
    (keras.layers.LSTM(8), [tf.TensorSpec([2, 5, 3])], 5 * (2 * 2 * 32 * 3 + 2 * 2 * 32 * 8)),
])
def test_conv_matmul_flops(body: Callable[..., tf.Tensor], specs: list[tf.TensorSpec], expected: int) -> None:
    assert flops.conv_matmul_flops(_graph(body, *specs)) == expected
