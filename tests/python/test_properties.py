"""Property tests: any size, dtype and alignment give numpy's answer.

Hypothesis draws a dtype TVM compiles an ``inc_<dtype>`` for (x + 1; ``not x``
for bool), a length (0 included) and the ``alignment`` the op must give TVM's
buffers (above TF's 64 bytes, the op copies through aligned scratch memory), and
values across each dtype's range (ints wrap as numpy's do).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tf_op
from helpers import TVM_DTYPES as DTYPES



def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, np.ndarray, int]:
    name = draw(st.sampled_from(DTYPES))
    dtype = numpy_dtype(name)
    # bfloat16 is no numpy dtype hypothesis draws from: draw float32 and round.
    draw_dtype = np.dtype("float32") if name == "bfloat16" else dtype
    elements = None if draw_dtype.kind != "f" else st.floats(-1e4, 1e4, width=draw_dtype.itemsize * 8)
    x = draw(hnp.arrays(draw_dtype, st.integers(0, 300), elements=elements)).astype(dtype)
    alignment = draw(st.sampled_from([1, 16, 64, 128, 256, 4096]))
    return name, x, alignment


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_any_length_dtype_and_alignment_matches_numpy(testlib: str, case: tuple[str, np.ndarray, int]) -> None:
    name, x, alignment = case
    got = tf_op.Module(testlib).func(f"inc_{name}", alignment=alignment)(tf.constant(x)).numpy()
    if name == "bool":
        expected = ~x
    else:
        with np.errstate(over="ignore"):
            expected = (x + np.ones((), x.dtype)).astype(x.dtype)
    np.testing.assert_array_equal(got, expected)
