"""The defops make test-gpu runs on a GPU (tests/gpu/defop_harness.c checks each
variant against a reference computed in C): elementwise with a tail (vadd, two
dtypes, three ranks), a fused elementwise op reading a bias along its last axis
(the issue's swish), and reductions along the last axis (row_sum: a warp per
row) and across rows (col_sum: a thread per column), each under build_ops'
default CUDA schedule."""
from tvm import te

from tf_op_tvm import defop


@defop(name="vadd", dtypes=["float32", "int32"], ndims=[1, 2, 3], auto_broadcast=True)
def vadd(dtype, ndim):
    A = te.placeholder([te.var() for _ in range(ndim)], name="A", dtype=dtype)
    B = te.placeholder([te.var() for _ in range(ndim)], name="B", dtype=dtype)
    return [A, B, te.compute(A.shape, lambda *i: A[i] + B[i], name="C")]


@defop(name="swish_bias", dtypes=["float32"], ndims=[2])
def swish_bias(dtype, ndim):
    X = te.placeholder([te.var(), te.var()], name="X", dtype=dtype)
    b = te.placeholder([X.shape[1]], name="b", dtype=dtype)
    s = te.compute(X.shape, lambda i, j: X[i, j] + b[j], name="s")
    return [X, b, te.compute(X.shape, lambda i, j: s[i, j] * te.sigmoid(s[i, j]), name="Y")]


@defop(name="row_sum", dtypes=["float32"], ndims=[2])
def row_sum(dtype, ndim):
    A = te.placeholder([te.var(), te.var()], name="A", dtype=dtype)
    k = te.reduce_axis((0, A.shape[1]), name="k")
    return [A, te.compute((A.shape[0],), lambda i: te.sum(A[i, k], axis=k), name="S")]


@defop(name="col_sum", dtypes=["float32"], ndims=[2])
def col_sum(dtype, ndim):
    A = te.placeholder([te.var(), te.var()], name="A", dtype=dtype)
    k = te.reduce_axis((0, A.shape[0]), name="k")
    return [A, te.compute((A.shape[1],), lambda j: te.sum(A[k, j], axis=k), name="S")]
