"""exp, log, erf, sigmoid and tanh for TVM's CPU (llvm) code that LLVM can vectorize.

TVM lowers ``exp`` and ``log`` on CPUs to calls of libm's ``expf`` and ``logf``,
one element at a time: LLVM cannot vectorize a loop that calls them, and in a
small fused kernel they are most of the time (``tf_op.compile`` of a ``tf.function``
of math ops at batch 32: 23 of 30 µs). TensorFlow's kernels use Eigen's polynomial
``pexp``/``plog`` on whole vectors instead. ``register()`` makes TVM lower both
to the same Cephes polynomials Eigen uses, written as plain arithmetic on the
float's bits, which LLVM vectorizes like any elementwise code. ``erf`` (exact
GELU's) would be libm's ``erff`` too; it becomes the rational function Eigen
and XLA use for float32 erf. ``sigmoid`` (swish's, the gates') TVM makes
1 / (1 + exp(-x)); it becomes TF's own float32 logistic, a cheaper exp of x/2
squared. ``tanh`` (the LSTM's, approximate GELU's), two exps in TVM, becomes
TF's own rational function.

Accuracy: within 1 ulp of the exact value for normal inputs and results, as
libm's (tests/python/test_compiler.py measures it against numpy in float64, on a
million inputs). Special values are kept: NaN gives
NaN, ``exp`` of a large x gives inf, ``log(0)`` is -inf, ``log`` of a negative
number is NaN, ``log(inf)`` is inf. Results below the smallest normal float
(``exp(x)`` for x < -87.34) are subnormal, as in libm, and 0 below -103.97;
``log`` of a subnormal input is computed after scaling it up. ``erf``: within
8 ulps of the exact value (5e-7 absolute), ±1 for |x| >= 4 and at ±inf, NaN kept.
``sigmoid``: within 6 ulps (test_cpu_schedule.py), 1 above 16.64, 0 below -104,
NaN kept. ``tanh``: within 6 ulps, ±1 from ±7.91, ±0 and NaN kept.

Only the TVM worker (``compile_model.py``) registers it: registering changes
how that process lowers every llvm function it compiles.
"""

from __future__ import annotations

from typing import Any

#: TVM's priority for a lowering rule: above the default llvm rules (level 10).
_LEVEL = 99

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 split so that n * _LN2_HI is exact
#: exp(89) is inf in float32, and n = 128 makes the product inf; exp(-104) rounds to 0
#: (below half the smallest subnormal), n = -150 makes it 0.
_EXP_CLAMP_HI, _EXP_CLAMP_LO = 89.0, -104.0
#: 1.5 * 2^23: a float of magnitude below 2^22 plus this is rounded to an integer,
#: which the sum's low mantissa bits hold.
_ROUNDER = 12582912.0
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524
#: Eigen's logistic: above this x the rational result is 1 in float32; e^(x/2) by
#: 1 + r + r^2 (p2 + p3 r + p4 r^2 + p5 r^3), coefficients (p4, p5, p2, p3).
_SIGMOID_HI = 16.6355324
_SIGMOID_POLY = (4.1898667812347412109375e-2, 8.33471305668354034423828125e-3, 0.49999141693115234375,
                 0.16666877269744873046875)
#: Eigen's tanh: tanh(x) = (x + x^3 P(x^2)) / Q(x^2), exactly 1 from this x on
#: without FMA; coefficients from the highest power down.
_TANH_ONE = 7.90738964080810547
_TANH_P = (1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1)
_TANH_Q = (8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1, 1.0)
#: erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (float32 erf is ±1 outside), highest power first.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)
_MIN_NORMAL = 1.17549435e-38

_DL_FLOAT = 2  # DLPack's type code of IEEE floats (bfloat16 has its own)

_registered = False


def register() -> None:
    """Lowers float32 ``exp``, ``log``, ``erf``, ``sigmoid`` and ``tanh``
    (scalar, or vectors, as MetaSchedule's vectorized kernels call them) for
    llvm targets to the functions below; other dtypes keep TVM's lowering. Once
    per process: TVM refuses a second rule at the same level."""
    global _registered
    import tvm
    from tvm import tirx

    if _registered:
        return
    for name, rule in (("tirx.exp", vector_exp), ("tirx.log", vector_log), ("tirx.erf", vector_erf),
                       ("tirx.sigmoid", vector_sigmoid), ("tirx.tanh", vector_tanh)):
        replaced = tvm.ir.Op.get(name).get_attr("llvm.FLowerIntrinsic")
        tirx.register_intrin_lowering(name, target="llvm", f=_float32_only(rule, replaced), level=_LEVEL)
    _registered = True


def _float32_only(rule: Any, replaced: Any) -> Any:
    """``rule`` for float32; other dtypes as TVM lowers them without it: by
    ``replaced``, the llvm rule this one takes the place of (exp and log: LLVM's
    intrinsic; tanh: a pair of exps), or, where there is none, by TVM's default
    rules, which a call returned unchanged goes on to (erf: libm's; sigmoid:
    1 / (1 + exp(-x)))."""
    from tvm.runtime import DataType

    def lower(call: Any) -> Any:
        dtype = DataType(str(call.ty))
        if dtype.type_code != _DL_FLOAT or dtype.bits != 32:
            return replaced(call) if replaced is not None else call
        return rule(call.args[0], dtype.lanes)

    return lower


class _Lanes:
    """Constants and types for ``lanes``-wide float32 / int32 values (1: scalars)."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.int32 = "int32" if lanes == 1 else f"int32x{lanes}"
        self.float32 = "float32" if lanes == 1 else f"float32x{lanes}"

    def _const(self, value: float, dtype: str) -> Any:
        from tvm import tirx

        scalar = tirx.const(value, dtype)
        return scalar if self.lanes == 1 else tirx.Broadcast(scalar, self.lanes)

    def f(self, value: float) -> Any:
        return self._const(value, "float32")

    def i(self, value: int) -> Any:
        return self._const(value, "int32")


def _poly(x: Any, coefficients: tuple[float, ...], v: _Lanes) -> Any:
    """Horner's rule: coefficients from the highest power down."""
    acc = v.f(coefficients[0])
    for c in coefficients[1:]:
        acc = acc * x + v.f(c)
    return acc


def vector_exp(x: Any, lanes: int = 1) -> Any:
    """Cephes ``expf``: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by a degree-7
    polynomial, times 2^n made in two halves' exponent bits (so that n from
    -150 to 128 needs no exponent outside float32's normal range).

    n is rounded by ``_reduce``'s add, where a floor and two conversions took
    5 instructions. x is clamped where exp is already inf or 0, so that the
    product makes those itself; only NaN needs a select. A vectorized loop's
    body went from 45 to 28 instructions, 14 to 9.6 cycles a vector of 16 on
    Zen 5."""
    from tvm import tirx

    v = _Lanes(lanes)
    k, r = _reduce(tirx.max(tirx.min(x, v.f(_EXP_CLAMP_HI)), v.f(_EXP_CLAMP_LO)), v)
    p = _poly(r, _EXP_POLY, v) * r * r + r + v.f(1.0)
    half = k >> v.i(1)
    result = p * _pow2(half, v) * _pow2(k - half, v)
    return tirx.Select(tirx.isnan(x), x, result)


def vector_sigmoid(x: Any, lanes: int = 1) -> Any:
    """TF's own float32 sigmoid (Eigen's ``scalar_logistic_op<float>``):
    e^x / (1 + e^x), with e^x made as e^(x/2) squared, so that e^(x/2) is
    never subnormal and one exponent's bits scale it; e^(x/2) by a degree-5
    polynomial after the same range reduction as ``vector_exp``. Where TVM made
    1 / (1 + exp(-x)): 12.1 to 8.7 cycles a vector of 16 on Zen 5, within 6 ulps."""
    from tvm import tirx

    v = _Lanes(lanes)
    m, r = _reduce(tirx.min(x, v.f(_SIGMOID_HI)) * v.f(0.5), v)
    r2 = r * r
    p4, p5, p2, p3 = (v.f(c) for c in _SIGMOID_POLY)
    p = r2 * (r * (r2 * p5 + p3) + (r2 * p4 + p2)) + (r + v.f(1.0))
    e = p * _pow2(tirx.max(m, v.i(-126)), v)
    e = e * e
    result = tirx.Select(x < v.f(_EXP_CLAMP_LO), v.f(0.0), e / (e + v.f(1.0)))
    return tirx.Select(tirx.isnan(x), x, result)


def vector_tanh(x: Any, lanes: int = 1) -> Any:
    """TF's own float32 tanh (Eigen's ``ptanh_float``): x P(x^2) / Q(x^2), a
    [9/8] rational function, and ±1 from where it is 1 without FMA (Eigen's
    clamp for that case; with FMA it reaches 1 a little later, within 5 ulps).
    TVM's lowering took two exps: 23 to 6.7 cycles a vector of 16 on Zen 5,
    within 6 ulps."""
    from tvm import tirx

    v = _Lanes(lanes)
    clamped = tirx.max(tirx.min(x, v.f(_TANH_ONE)), v.f(-_TANH_ONE))
    square = clamped * clamped
    p = clamped * square * _poly(square, _TANH_P, v) + clamped
    result = tirx.Select(x >= v.f(_TANH_ONE), v.f(1.0),
                         tirx.Select(x <= v.f(-_TANH_ONE), v.f(-1.0), p / _poly(square, _TANH_Q, v)))
    return tirx.Select(tirx.isnan(x), x, result)


def _reduce(x: Any, v: _Lanes) -> tuple[Any, Any]:
    """x = n ln 2 + r with n an integer and |r| <= ln 2 / 2, for |x| under
    2^22 / log2(e): (n as int32, r). n is rounded by adding ``_ROUNDER``,
    which leaves it in the sum's low mantissa bits, as XNNPACK does: one add
    gives n as a float and, from the bits, as an integer."""
    from tvm import tirx

    rounded = x * v.f(_LOG2E) + v.f(_ROUNDER)
    n = rounded - v.f(_ROUNDER)
    k = tirx.reinterpret(v.int32, rounded) - tirx.reinterpret(v.int32, v.f(_ROUNDER))
    return k, x - n * v.f(_LN2_HI) - n * v.f(_LN2_LO)


def _pow2(k: Any, v: _Lanes) -> Any:
    """2.0^k for an int32 k in float32's normal exponent range."""
    from tvm import tirx

    return tirx.reinterpret(v.float32, (k + v.i(127)) << v.i(23))


def vector_log(x: Any, lanes: int = 1) -> Any:
    """Cephes ``logf``: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a
    polynomial in m - 1, plus e ln 2."""
    from tvm import tirx

    v = _Lanes(lanes)
    subnormal = x < v.f(_MIN_NORMAL)
    scaled = tirx.Select(subnormal, x * v.f(2.0**23), x)  # a subnormal's exponent bits say nothing
    bits = tirx.reinterpret(v.int32, scaled)
    e = ((bits >> v.i(23)) & v.i(0xFF)) - v.i(126) - tirx.Select(subnormal, v.i(23), v.i(0))
    m = tirx.reinterpret(v.float32, (bits & v.i(0x007FFFFF)) | v.i(0x3F000000))  # in [0.5, 1)
    small = m < v.f(_SQRT_HALF)
    e = e - tirx.Select(small, v.i(1), v.i(0))
    m = tirx.Select(small, m + m, m) - v.f(1.0)
    ef = e.astype(v.float32)
    z = m * m
    y = _poly(m, _LOG_POLY, v) * m * z + ef * v.f(_LN2_LO) - v.f(0.5) * z
    result = m + y + ef * v.f(_LN2_HI)
    result = tirx.Select(x == v.f(0.0), v.f(float("-inf")), result)
    result = tirx.Select(x == v.f(float("inf")), x, result)
    return tirx.Select(tirx.isnan(x) | (x < v.f(0.0)), v.f(float("nan")), result)


def vector_erf(x: Any, lanes: int = 1) -> Any:
    """Eigen's float32 ``erf``: x P(x^2) / Q(x^2) with x clamped to [-4, 4],
    where erf is already ±1 in float32."""
    from tvm import tirx

    v = _Lanes(lanes)
    clamped = tirx.max(tirx.min(x, v.f(4.0)), v.f(-4.0))
    square = clamped * clamped
    result = clamped * _poly(square, _ERF_P, v) / _poly(square, _ERF_Q, v)
    return tirx.Select(tirx.isnan(x), x, result)
