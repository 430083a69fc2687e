"""Kernels written in Python with TVM, built ahead of time for every dtype and
rank they declare, and called as TensorFlow ops (``tf_op.load_ops``), as
MXNet's ``defop`` did:

    from tvm import te
    from tf_op_tvm import defop

    @defop(name="vadd", dtypes=["float32", "float64", "int32"], ndims=[1, 2, 3], auto_broadcast=True)
    def vadd(dtype, ndim):
        A = te.placeholder([te.var() for _ in range(ndim)], name="A", dtype=dtype)
        B = te.placeholder([te.var() for _ in range(ndim)], name="B", dtype=dtype)
        return [A, B, te.compute(A.shape, lambda *i: A[i] + B[i], name="C")]

The function receives ``(dtype, ndim)`` and returns its placeholders, then its
outputs. ``python -m tf_op_tvm.build_ops my_ops.py -o my_ops.so`` builds every
variant of every ``defop`` of the file into one library, and writes its
manifest beside it (``build_ops``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

#: What a defop function returns: its placeholders, then its outputs (te.Tensor).
Compute = Callable[[str, int], Sequence[Any]]
#: An expert's schedule: given a ``tvm.s_tir.Schedule`` of one variant, its dtype
#: and rank, returns the schedule to build (or None for the default one).
ScheduleHook = Callable[[Any, str, int], Any]


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """One ``defop``: its compute and the variants to build of it."""

    name: str
    compute: Compute
    dtypes: tuple[str, ...]
    ndims: tuple[int, ...]
    auto_broadcast: bool
    schedule: ScheduleHook | None
    grad: str | None


#: The defops of the files build_ops ran, by name, in definition order.
_DEFINED: dict[str, OpDefinition] = {}


def defop(
    *,
    name: str,
    dtypes: Sequence[str],
    ndims: Sequence[int],
    auto_broadcast: bool = False,
    schedule: ScheduleHook | None = None,
    grad: str | None = None,
) -> Callable[[Compute], Compute]:
    """Declares a TF op computed by TVM: ``name``, built for each of ``dtypes``
    and ``ndims``. With ``auto_broadcast``, the inputs broadcast as NumPy's do
    (each input of a variant must then have its rank). ``schedule`` replaces
    the default CPU schedule; ``grad`` names another defop of the file that
    computes the input gradients from the inputs, the outputs and the upstream
    gradients, in that order."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"defop: name must be a Python identifier, got {name!r}")
    if name in _DEFINED:
        raise ValueError(f"defop: {name!r} is defined twice")
    if isinstance(dtypes, str) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        raise ValueError(f"defop {name}: dtypes must be a list of dtype names, got {dtypes!r}")
    if not ndims or not all(isinstance(n, int) and 0 <= n <= 8 for n in ndims):
        raise ValueError(f"defop {name}: ndims must be a list of ranks from 0 to 8, got {ndims!r}")
    if grad is not None and (not isinstance(grad, str) or not grad.isidentifier()):
        raise ValueError(f"defop {name}: grad must name another defop, got {grad!r}")

    def register(compute: Compute) -> Compute:
        _DEFINED[name] = OpDefinition(
            name, compute, tuple(dict.fromkeys(dtypes)), tuple(dict.fromkeys(ndims)), bool(auto_broadcast), schedule, grad
        )
        return compute

    return register


def defined_ops() -> list[OpDefinition]:
    """The defops declared so far, in order."""
    return list(_DEFINED.values())


def clear() -> None:
    """Forgets the defops declared so far (build_ops runs one file at a time)."""
    _DEFINED.clear()
