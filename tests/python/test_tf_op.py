"""TVMDSOOp end to end: real TVM modules called from real TensorFlow."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_op
from helpers import ffi_only_library_path, run_python


@pytest.fixture(scope="module")
def mod(testlib: str) -> tf_op.Module:
    return tf_op.Module(testlib)


def test_add_one_symbolic_length_eager(mod: tf_op.Module) -> None:
    add_one = mod.func("add_one")
    for n in (1, 7, 1000):
        x = np.arange(n, dtype=np.float32)
        y = add_one(tf.constant(x))
        assert y.dtype == tf.float32
        np.testing.assert_array_equal(y.numpy(), x + 1)


def test_getitem(mod: tf_op.Module) -> None:
    y = mod["add_one"](tf.constant([1.0, 2.0]))
    np.testing.assert_array_equal(y.numpy(), [2.0, 3.0])


def test_opmodule_takes_the_old_argument_order(mod: tf_op.Module) -> None:
    """tvm.contrib.tf_op.OpModule.func(name, output_dtype=None, output_shape=None):
    the dtype first, float32 by default; old positional calls work as they did."""
    old = tf_op.OpModule(mod.lib_path)
    x = tf.constant([1.0, 2.0])
    cases = [
        old["add_one"],
        old.func("add_one"),
        old.func("add_one", "float"),
        old.func("add_one", "float32", [2]),
        old.func("add_one", tf.float32, tf.constant([2], tf.int64)),
        old.func("add_one", output_shape=[tf.constant(2)]),
    ]
    for fn in cases:
        y = fn(x)
        assert y.dtype == tf.float32
        np.testing.assert_array_equal(y.numpy(), [2.0, 3.0])
    # The old default is float32, not the input's dtype: a float64 function needs it said.
    inc = old.func("inc_float64", "float64")
    np.testing.assert_array_equal(inc(tf.constant([1.0], tf.float64)).numpy(), [2.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="inc_float64"):
        old.func("inc_float64")(tf.constant([1.0], tf.float64))


def test_tf_function_with_unknown_length(mod: tf_op.Module) -> None:
    add_one = mod.func("add_one")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def f(x: tf.Tensor) -> tf.Tensor:
        y = add_one(x)
        assert y.shape.as_list() == [None]  # shape inference: the first input's
        return y * 2.0

    np.testing.assert_array_equal(f(tf.constant([1.0, 2.0, 3.0])).numpy(), [4.0, 6.0, 8.0])
    np.testing.assert_array_equal(f(tf.constant([5.0])).numpy(), [12.0])


def test_tf1_graph_session(mod: tf_op.Module) -> None:
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [None])
        y = mod.func("vector_add")(x, x)
        with tf.compat.v1.Session(graph=g) as sess:
            out = sess.run(y, feed_dict={x: np.array([1.5, 2.5], np.float32)})
    np.testing.assert_array_equal(out, [3.0, 5.0])


def test_two_inputs(mod: tf_op.Module) -> None:
    y = mod.func("vector_add")(tf.constant([1.0, 2.0, 3.0]), tf.constant([10.0, 20.0, 30.0]))
    np.testing.assert_array_equal(y.numpy(), [11.0, 22.0, 33.0])


def test_nine_inputs_keep_their_order(mod: tf_op.Module) -> None:
    xs = [tf.constant([float(k), 1.0]) for k in range(9)]
    y = mod.func("sum9")(*xs)
    # out = sum over k of (k + 1) * xs[k]
    expected = [sum((k + 1) * k for k in range(9)), sum(k + 1 for k in range(9))]
    np.testing.assert_array_equal(y.numpy(), expected)


def test_mixed_input_dtypes(mod: tf_op.Module) -> None:
    scale = mod.func("scale_mixed", output_dtype="float64")
    y = scale(
        tf.constant([1.5, 2.0, -1.0], tf.float32),
        tf.constant([2, 3, 4], tf.int32),
        tf.constant([0.25, 0.0, 10.0], tf.float64),
    )
    assert y.dtype == tf.float64
    np.testing.assert_array_equal(y.numpy(), [3.25, 6.0, 6.0])


def test_output_dtype_as_tf_dtype(mod: tf_op.Module) -> None:
    y = mod.func("add_one_i64", output_dtype=tf.int64)(tf.constant([1, -5], tf.int64))
    np.testing.assert_array_equal(y.numpy(), [2, -4])


def test_2d(mod: tf_op.Module) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = mod.func("matrix_add_one")(tf.constant(x))
    np.testing.assert_array_equal(y.numpy(), x + 1)


@pytest.mark.parametrize(
    ("name", "output_shape", "expected"),
    [
        ("transpose", [3, 2], lambda x: x.T),
        ("row_sum", [2], lambda x: x.sum(axis=1)),
    ],
)
def test_output_shape_differs_from_input(mod: tf_op.Module, name: str, output_shape: list[int], expected) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    fn = mod.func(name, output_shape=output_shape)
    np.testing.assert_array_equal(fn(tf.constant(x)).numpy(), expected(x))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(t: tf.Tensor) -> tf.Tensor:
        y = fn(t)
        assert y.shape.as_list() == output_shape  # shape inference: the declared shape
        return y

    np.testing.assert_array_equal(f(tf.constant(x)).numpy(), expected(x))


def test_eager_calls_make_the_ops_arguments_once(mod: tf_op.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eagerly, a function whose output sizes are static makes the op's
    arguments at its first call per dtype of the first input (which an output
    of no declared dtype takes); one whose sizes are tensors, and calls being
    traced, make them at each call. The answers stay right."""
    made: list[str] = []
    real = tf_op.Func._library_and_grad
    monkeypatch.setattr(tf_op.Func, "_library_and_grad", lambda self: made.append(self.func_name) or real(self))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    row_sum = mod.func("row_sum", output_shape=[2])
    for _ in range(3):
        np.testing.assert_array_equal(row_sum(tf.constant(x)).numpy(), x.sum(axis=1))
    add_one = mod.func("add_one")  # the output takes the input's shape and dtype: one set of arguments
    for n in (1, 5, 5):
        np.testing.assert_array_equal(add_one(tf.constant(np.arange(n, dtype=np.float32))).numpy(), np.arange(n) + 1)
    add_one_i64 = mod.func("add_one_i64")
    np.testing.assert_array_equal(add_one_i64(tf.constant([1, -5], tf.int64)).numpy(), [2, -4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="int64"):  # another dtype: its own arguments
        add_one_i64(tf.constant([1.0]))
    sized = mod.func("row_sum", output_shape=[tf.constant(2)])
    for _ in range(2):
        np.testing.assert_array_equal(sized(tf.constant(x)).numpy(), x.sum(axis=1))
    traced = tf.function(row_sum)
    for shift in range(2):
        np.testing.assert_array_equal(traced(tf.constant(x + shift)).numpy(), (x + shift).sum(axis=1))
    assert made == ["row_sum", "add_one", "add_one_i64", "add_one_i64", "row_sum", "row_sum", "row_sum"]


def test_functions_traced_by_tf_function_convert_without_autograph_warnings(testlib: str) -> None:
    """AutoGraph converts what a tf.function calls, the op's Python among it: a
    construct it cannot read (an assignment expression) makes it warn the user
    of code that is not theirs."""
    done = run_python(textwrap.dedent("""
        import sys
        import numpy as np, tensorflow as tf
        import tf_op
        row_sum = tf_op.Module(sys.argv[1]).func("row_sum", output_shape=[2])
        print(tf.function(row_sum)(tf.constant(np.ones((2, 3), np.float32))).numpy().tolist())
    """), testlib)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[3.0, 3.0]"
    assert "AutoGraph" not in done.stderr, done.stderr[-2000:]


def test_misaligned_buffers_are_copied_with_right_values(mod: tf_op.Module) -> None:
    # TF aligns buffers to 64 bytes; asking for 4096 forces the scratch copies of
    # inputs and output and the copy back.
    fn = mod.func("vector_add", alignment=4096)
    a, b = np.arange(100, dtype=np.float32), np.full(100, 0.5, np.float32)
    np.testing.assert_array_equal(fn(tf.constant(a), tf.constant(b)).numpy(), a + b)


def test_fixed_shape_given_wrong_shape_then_recovers(mod: tf_op.Module) -> None:
    fn = mod.func("add_one_4")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)add_one_4.*expected 4.*input 0: float32\[3\]"):
        fn(tf.constant([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(fn(tf.constant([1.0, 2.0, 3.0, 4.0])).numpy(), [2.0, 3.0, 4.0, 5.0])


def test_wrong_dtype_is_tvm_error(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32"):
        mod.func("add_one")(tf.constant([1, 2], tf.int32))


def test_wrong_number_of_inputs(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"vector_add.*Expected 3 arguments"):
        mod.func("vector_add")(tf.constant([1.0]))


def add_one_op(library: str | Path) -> tf.Tensor:
    """The op on add_one of library, added without tf_op.Module's checks (which
    refuse these paths when it is made: test_module_errors.py)."""
    return tf_op.ops().tvmdso_op(
        args=[tf.constant([1.0])], output_dims=[], Tout=[tf.float32], output_shapes=[tf.TensorShape(None)],
        library=str(library), func_name="add_one",
    )


def test_missing_library(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.so")
    with pytest.raises(FileNotFoundError, match=path):
        tf_op.Module(path)
    with pytest.raises(tf.errors.NotFoundError, match=path):
        add_one_op(path)


def test_not_a_library(tmp_path: Path) -> None:
    path = tmp_path / "notalib.so"
    path.write_text("not a shared library")
    with pytest.raises(ValueError, match=str(path)):
        tf_op.Module(path)
    with pytest.raises(tf.errors.InvalidArgumentError, match=str(path)):
        add_one_op(path)


WITHOUT_TVM_RUNTIME_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import tf_op

    lib, fn, inputs, output_shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    try:
        out = tf_op.Module(lib).func(fn, output_shape=output_shape)(*[tf.ones(shape) for shape in inputs])
        print("ran", out.shape)
    except tf.errors.OpError as e:
        print(type(e).__name__, e.message)
    """
)


@pytest.mark.parametrize(
    ("lib", "fn", "inputs", "output_shape", "needs"),
    [
        ("modules/matmul.so", "matmul", [[512, 512], [512, 512]], [512, 512], "TVMBackend"),
        ("models/cnn_b1.so", "main", [[1, 16, 16, 3]], [1, 10], "relax.VMExecutable"),
    ],
    ids=["parallel loops and workspace", "a Relax VM executable"],
)
def test_tvm_compiled_library_without_tvms_runtime(
    modules_dir: Path, models_dir: Path, lib: str, fn: str, inputs: list, output_shape: list, needs: str
) -> None:
    """With only libtvm_ffi.so on the search path (apache-tvm-ffi without
    apache-tvm), a library that calls into TVM's runtime (its parallel loops and
    workspace go through pointers the runtime fills at load) or embeds a VM
    executable (which the runtime loads) is refused before it runs, with the fix;
    a call through such an unset pointer would crash the process."""
    path = {"modules": modules_dir, "models": models_dir}[lib.split("/")[0]] / lib.split("/")[1]
    result = run_python(WITHOUT_TVM_RUNTIME_SCRIPT, str(path), fn, json.dumps(inputs), json.dumps(output_shape),
                        env={"TVMDSOOP_LIBRARY_PATH": ffi_only_library_path()})
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("FailedPreconditionError"), line
    for part in (str(path), f"'{fn}'", needs, "libtvm_runtime.so", "apache-tvm", "TVMDSOOP_LIBRARY_PATH"):
        assert part in line, (part, line)


def test_unknown_function(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.NotFoundError, match="no_such_function"):
        mod.func("no_such_function")(tf.constant([1.0]))
    # The process and the module live on.
    np.testing.assert_array_equal(mod.func("add_one")(tf.constant([1.0])).numpy(), [2.0])


@pytest.mark.parametrize("alignment", [0, 3, 48, -64, True])
def test_bad_alignment(mod: tf_op.Module, alignment: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        mod.func("add_one", alignment=alignment)


def test_bad_alignment_reaching_the_op(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="power of two"):
        tf_op.ops().tvmdso_op(
            args=[tf.constant([1.0])],
            output_dims=[],
            Tout=[tf.float32],
            output_shapes=[tf.TensorShape(None)],
            library=mod.lib_path,
            func_name="add_one",
            alignment=12,
        )


@pytest.mark.parametrize("shape", [[-1], [2, -3], [1.5], ["2"]])
def test_bad_output_shape(mod: tf_op.Module, shape: list) -> None:
    with pytest.raises(ValueError, match="output 0 shape"):
        mod.func("add_one", output_shape=shape)


def test_empty_tensor(mod: tf_op.Module) -> None:
    y = mod.func("add_one")(tf.zeros([0], tf.float32))
    assert y.shape.as_list() == [0]
