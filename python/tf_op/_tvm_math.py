"""exp and log for TVM's CPU (llvm) code that LLVM can vectorize.

TVM lowers ``exp`` and ``log`` on CPUs to calls of libm's ``expf`` and ``logf``,
one element at a time: LLVM cannot vectorize a loop that calls them, and in a
small fused kernel they are most of the time (the bridge's ``tf.function`` of
math ops at batch 32: 23 of 30 µs). TensorFlow's kernels use Eigen's polynomial
``pexp``/``plog`` on whole vectors instead. ``register()`` makes TVM lower both
to the same Cephes polynomials Eigen uses, written as plain arithmetic on the
float's bits, which LLVM vectorizes like any elementwise code.

Accuracy: within 1 ulp of the exact value for normal inputs and results, as
libm's (tests/python/test_bridge.py measures it against numpy in float64, on a
million inputs). Special values are kept: NaN gives
NaN, ``exp`` of a large x gives inf, ``log(0)`` is -inf, ``log`` of a negative
number is NaN, ``log(inf)`` is inf. Results below the smallest normal float
(``exp(x)`` for x < -87.34) are subnormal, as in libm, and 0 below -103.97;
``log`` of a subnormal input is computed after scaling it up.

Only the TVM worker process (``_tvm_compile.py``) imports this: registering
changes how that process lowers every llvm function it compiles.
"""

from __future__ import annotations

from typing import Any

#: TVM's priority for a lowering rule: above the default llvm rules (level 10).
_LEVEL = 99

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 split so that n * _LN2_HI is exact
_EXP_HI = 88.72283935546875  # log of the largest float32: exp of more is inf
_EXP_LO = -103.97208404541016  # exp of less rounds to 0 in float32
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524
_MIN_NORMAL = 1.17549435e-38

_registered = False


def register() -> None:
    """Lowers float32 ``exp`` and ``log`` for llvm targets to the polynomials
    below (other dtypes keep libm's); once per process (TVM refuses a second
    rule at the same level)."""
    global _registered
    from tvm import tirx

    if _registered:
        return
    _registered = True
    tirx.register_intrin_lowering("tirx.exp", target="llvm", f=_float32_only(vector_exp), level=_LEVEL)
    tirx.register_intrin_lowering("tirx.log", target="llvm", f=_float32_only(vector_log), level=_LEVEL)


def _float32_only(rule: Any) -> Any:
    from tvm import tirx

    def lower(call: Any) -> Any:
        (x,) = call.args
        if str(call.ty) != "float32":  # libm's, as TVM lowers it by default
            return tirx.call_llvm_pure_intrin(str(call.ty), f"llvm.{call.op.name.split('.')[-1]}", x)
        return rule(x)

    return lower


def _poly(x: Any, coefficients: tuple[float, ...]) -> Any:
    """Horner's rule: coefficients from the highest power down."""
    from tvm import tirx

    acc = tirx.const(coefficients[0], "float32")
    for c in coefficients[1:]:
        acc = acc * x + tirx.const(c, "float32")
    return acc


def vector_exp(x: Any) -> Any:
    """Cephes ``expf``: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by a degree-7
    polynomial, times 2^n made in two halves' exponent bits (so that n from
    -150 to 128 needs no exponent outside float32's normal range)."""
    from tvm import tirx

    f32 = lambda v: tirx.const(v, "float32")  # noqa: E731
    clamped = tirx.max(tirx.min(x, f32(_EXP_HI)), f32(_EXP_LO))
    # floor by truncation, which SSE2 has for vectors (its floor is SSE4.1's)
    y = clamped * f32(_LOG2E) + f32(0.5)
    truncated = y.astype("int32")
    k = truncated - tirx.Select(truncated.astype("float32") > y, tirx.const(1, "int32"), tirx.const(0, "int32"))
    n = k.astype("float32")
    r = clamped - n * f32(_LN2_HI) - n * f32(_LN2_LO)
    p = _poly(r, _EXP_POLY) * r * r + r + f32(1.0)
    half = k >> 1
    result = p * _pow2(half) * _pow2(k - half)
    result = tirx.Select(x > f32(_EXP_HI), f32(float("inf")), result)
    result = tirx.Select(x < f32(_EXP_LO), f32(0.0), result)
    return tirx.Select(tirx.isnan(x), x, result)


def _pow2(k: Any) -> Any:
    """2.0^k for an int32 k in float32's normal exponent range."""
    from tvm import tirx

    return tirx.reinterpret("float32", (k + tirx.const(127, "int32")) << tirx.const(23, "int32"))


def vector_log(x: Any) -> Any:
    """Cephes ``logf``: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a
    polynomial in m - 1, plus e ln 2."""
    from tvm import tirx

    f32, i32 = (lambda v: tirx.const(v, "float32")), (lambda v: tirx.const(v, "int32"))  # noqa: E731
    subnormal = x < f32(_MIN_NORMAL)
    scaled = tirx.Select(subnormal, x * f32(2.0**23), x)  # a subnormal's exponent bits say nothing
    bits = tirx.reinterpret("int32", scaled)
    e = ((bits >> 23) & i32(0xFF)) - i32(126) - tirx.Select(subnormal, i32(23), i32(0))
    m = tirx.reinterpret("float32", (bits & i32(0x007FFFFF)) | i32(0x3F000000))  # in [0.5, 1)
    small = m < f32(_SQRT_HALF)
    e = e - tirx.Select(small, i32(1), i32(0))
    m = tirx.Select(small, m + m, m) - f32(1.0)
    ef = e.astype("float32")
    z = m * m
    y = _poly(m, _LOG_POLY) * m * z + ef * f32(_LN2_LO) - f32(0.5) * z
    result = m + y + ef * f32(_LN2_HI)
    result = tirx.Select(x == f32(0.0), f32(float("-inf")), result)
    result = tirx.Select(x == f32(float("inf")), x, result)
    return tirx.Select(tirx.isnan(x) | (x < f32(0.0)), f32(float("nan")), result)
