"""Kernels written with defop (tf_op_tvm.defops) for tests/python/test_defop.py:
built by ``python -m tf_op_tvm.build_ops defops.py -o defops.so``."""

from tvm import te, tirx

from tf_op_tvm import defop


@defop(name="vadd", dtypes=["float32", "float64", "int32"], ndims=[1, 2, 3], auto_broadcast=True)
def vadd(dtype, ndim):
    A = te.placeholder([te.var() for _ in range(ndim)], name="A", dtype=dtype)
    B = te.placeholder([te.var() for _ in range(ndim)], name="B", dtype=dtype)
    return [A, B, te.compute(A.shape, lambda *i: A[i] + B[i], name="C")]


@defop(name="vmul", dtypes=["float32"], ndims=[1, 2])
def vmul(dtype, ndim):
    """No broadcasting: both inputs must have the output's shape."""
    A = te.placeholder([te.var() for _ in range(ndim)], name="A", dtype=dtype)
    B = te.placeholder([te.var() for _ in range(ndim)], name="B", dtype=dtype)
    return [A, B, te.compute(A.shape, lambda *i: A[i] * B[i], name="C")]


@defop(name="row_sum", dtypes=["float32", "float64"], ndims=[2])
def row_sum(dtype, ndim):
    """A reduction: its output has a shape of its own."""
    A = te.placeholder([te.var(), te.var()], name="A", dtype=dtype)
    k = te.reduce_axis((0, A.shape[1]), name="k")
    return [A, te.compute((A.shape[0],), lambda i: te.sum(A[i, k], axis=k), name="S")]


@defop(name="concat", dtypes=["float32"], ndims=[1])
def concat(dtype, ndim):
    """An output whose size is the sum of its inputs'."""
    A = te.placeholder([te.var()], name="A", dtype=dtype)
    B = te.placeholder([te.var()], name="B", dtype=dtype)
    n = A.shape[0]
    return [A, B, te.compute((n + B.shape[0],), lambda i: tirx.if_then_else(i < n, A[i], B[i - n]), name="C")]


@defop(name="bias_swish", dtypes=["float32"], ndims=[1, 2], auto_broadcast=True)
def bias_swish(dtype, ndim):
    """(x + b) * sigmoid(x + b): one pass, where TF runs three kernels."""
    X = te.placeholder([te.var() for _ in range(ndim)], name="X", dtype=dtype)
    B = te.placeholder([te.var() for _ in range(ndim)], name="B", dtype=dtype)
    return [X, B, te.compute(X.shape, lambda *i: (X[i] + B[i]) * te.sigmoid(X[i] + B[i]), name="Y")]


@defop(name="swish", dtypes=["float32"], ndims=[1, 2], grad="swish_grad")
def swish(dtype, ndim):
    X = te.placeholder([te.var() for _ in range(ndim)], name="X", dtype=dtype)
    return [X, te.compute(X.shape, lambda *i: X[i] * te.sigmoid(X[i]), name="Y")]


@defop(name="swish_grad", dtypes=["float32"], ndims=[1, 2])
def swish_grad(dtype, ndim):
    """swish's input gradient from its input, output and upstream gradient."""
    X = te.placeholder([te.var() for _ in range(ndim)], name="X", dtype=dtype)
    Y = te.placeholder(X.shape, name="Y", dtype=dtype)
    DY = te.placeholder(X.shape, name="DY", dtype=dtype)

    def dx(*i):
        s = te.sigmoid(X[i])
        return DY[i] * (s + X[i] * s * (1 - s))

    return [X, Y, DY, te.compute(X.shape, dx, name="DX")]
