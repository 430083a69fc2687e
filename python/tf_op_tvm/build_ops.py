"""Builds every variant of every ``defop`` of a Python file into one library,
and writes the manifest that ``tf_op.load_ops`` reads beside it:

    python -m tf_op_tvm.build_ops my_ops.py -o my_ops.so [--target llvm]

writes ``my_ops.so`` and ``my_ops.json``. Each variant is a plain TVM function,
``<op>_<dtype>_<ndim>d``, taking its inputs then its outputs (destination
passing), so Go and any TVM-FFI caller can call it too.

The manifest says, per op: its variants (dtype and rank), whether its inputs
broadcast, its gradient op, and per variant each input's dtype and rank and
each output's dtype and shape, as an expression of the inputs' dimensions
(``["dim", input, axis]``, integers, and ``["+", a, b]``-style operations), so
that TensorFlow knows every output's shape without running anything. It also
names the inputs that an output reads element by element (``A[i]`` at the
output's own index ``i``): those must have the output's shape, which the op
checks before the kernel runs, since TVM's kernel takes each input's sizes as
they come and would read past a smaller one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from tf_op_tvm import defops

#: The manifest's format, checked by tf_op.load_ops.
MANIFEST_FORMAT = "tvmdsoop-defop-1"

#: Operations a shape expression may use, by TVM node type.
_SHAPE_OPS = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%", "Min": "min", "Max": "max"}


class DefopError(ValueError):
    """A defop that cannot be built, naming it, the variant and the reason."""


def manifest_path(library: Path) -> Path:
    """Where the manifest of a library goes: beside it, ``.json`` for its suffix."""
    return library.with_suffix(".json")


def build_ops(source: Path, output: Path, target: Any = "portable") -> dict[str, Any]:
    """Builds the defops of ``source`` into the library ``output`` and writes its
    manifest (``manifest_path``); returns the manifest. ``target``: TVM's, or
    ``"portable"`` (the default, as tf_op.compile's): one build per x86-64 level
    in the library, dsoop loading the highest this CPU has.

    AVX-512's note: the default schedules leave the innermost loop to LLVM's
    vectorizer, which on x86-64-v4 keeps to 256-bit vectors (its
    ``prefer-256-bit`` tuning) unless told otherwise. The portable build's
    AVX-512 level uses 512-bit ones: ``bias_swish`` on 2048x2048 went from 1.98
    to 1.40 ms a call (TF's own ops: 2.32)."""
    import tvm

    from tf_op_tvm import compile_model, math_lowering

    defops.clear()
    runpy.run_path(str(source), run_name="__defops__")
    ops = defops.defined_ops()
    if not ops:
        raise DefopError(f"{source} declares no @defop")
    names = {op.name for op in ops}
    for op in ops:
        if op.grad is not None and op.grad not in names:
            raise DefopError(f"defop {op.name}: its grad {op.grad!r} is not a defop of {source}")
    # Each variant's function and manifest entry, made once; each level schedules its own copy.
    variants: list[tuple[Any, Any, str, int]] = []  # (op, unscheduled function, dtype, ndim)
    manifest_ops: dict[str, Any] = {}
    for op in ops:
        entries = []
        for dtype in op.dtypes:
            for ndim in op.ndims:
                func, entry = _variant(op, dtype, ndim, f"defop {op.name} ({dtype}, {ndim} dimensions)")
                variants.append((op, func, dtype, ndim))
                entries.append(entry)
        manifest_ops[op.name] = {"auto_broadcast": op.auto_broadcast, "grad": op.grad, "variants": entries}

    def build_level(level: Any) -> tuple[Any, Any]:
        if isinstance(level, dict) and level.get("mcpu") == "x86-64-v4":
            level = {**level, "mattr": ["-prefer-256-bit"]}  # see AVX-512's note below
        tvm_target = tvm.target.Target(level)
        if tvm_target.kind.name == "llvm":
            math_lowering.register()  # exp (sigmoid's), log and erf that LLVM vectorizes
        functions = {func.attrs["global_symbol"]: _scheduled(op, func, dtype, ndim, tvm_target)
                     for op, func, dtype, ndim in variants}
        return tvm.compile(tvm.IRModule(functions), target=tvm_target), tvm_target

    output.parent.mkdir(parents=True, exist_ok=True)
    compile_model.ensure_linker(output.parent)
    compile_model.export_levels(build_level, output, target)
    on_gpu = target != compile_model.PORTABLE and tvm.target.Target(target).kind.name == "cuda"
    manifest = {
        "format": MANIFEST_FORMAT,
        "device": "cuda" if on_gpu else "cpu",
        "library": output.name,
        "library_sha256": hashlib.sha256(output.read_bytes()).hexdigest(),
        "ops": manifest_ops,
    }
    manifest_path(output).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _variant(op: Any, dtype: str, ndim: int, where: str) -> tuple[Any, dict[str, Any]]:
    """One variant's function, ``<op>_<dtype>_<ndim>d``, not scheduled yet, and
    its manifest entry."""
    from tvm import te

    function_name = f"{op.name}_{dtype}_{ndim}d"
    try:
        tensors = list(op.compute(dtype, ndim))
    except Exception as e:
        raise DefopError(f"{where}: its function raised {type(e).__name__}: {e}") from e
    if not all(isinstance(t, te.Tensor) for t in tensors):
        raise DefopError(f"{where}: must return te tensors (its placeholders, then its outputs), got {tensors!r}")
    count = next((i for i, t in enumerate(tensors) if not isinstance(t.op, te.PlaceholderOp)), len(tensors))
    inputs, outputs = tensors[:count], tensors[count:]
    if not inputs or not outputs:
        raise DefopError(f"{where}: must return its placeholders, then at least one output")
    if any(not isinstance(t.op, te.ComputeOp) for t in outputs):
        raise DefopError(f"{where}: its outputs must follow its placeholders and be te.compute tensors")
    if op.auto_broadcast and any(len(t.shape) != ndim for t in inputs):
        raise DefopError(f"{where}: with auto_broadcast, each input must have {ndim} dimensions")
    dims = _input_dims(inputs, where)
    entry = {
        "dtype": dtype,
        "ndim": ndim,
        "function": function_name,
        "inputs": [{"dtype": str(t.dtype), "shape": [_expr(d, dims, where) if _is_int(d) else None for d in t.shape]}
                   for t in inputs],
        "outputs": [{"dtype": str(t.dtype), "shape": [_expr(d, dims, where) for d in t.shape],
                     "elementwise_inputs": _elementwise_inputs(t, inputs)} for t in outputs],
    }
    return te.create_prim_func([*inputs, *outputs]).with_attr("global_symbol", function_name), entry


def _scheduled(op: Any, func: Any, dtype: str, ndim: int, target: Any) -> Any:
    """A variant's function scheduled for target: by the defop's hook, else the
    default for the target's kind (a schedule works on a copy)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    if op.schedule is not None:
        scheduled = op.schedule(sch, dtype, ndim)
    elif target.kind.name == "cuda":
        scheduled = _cuda_schedule(sch)
    else:
        scheduled = _default_schedule(sch, target)
    if scheduled is None:
        return func
    return scheduled.mod["main"].with_attr("global_symbol", func.attrs["global_symbol"])


def _is_int(value: Any) -> bool:
    from tvm import tirx

    return isinstance(value, tirx.IntImm)


def _input_dims(inputs: list[Any], where: str) -> dict[Any, list[Any]]:
    """The inputs' shape variables, each as the first ``["dim", input, axis]``
    that has it. A size must be a variable or an integer."""
    from tvm import tirx

    dims: dict[Any, list[Any]] = {}
    for i, t in enumerate(inputs):
        for axis, d in enumerate(t.shape):
            if isinstance(d, tirx.Var):
                dims.setdefault(d, ["dim", i, axis])
            elif not _is_int(d):
                raise DefopError(f"{where}: input {i} ({t.op.name}) has size {d} on axis {axis}: "
                                 "an input's sizes must be te.var() or integers")
    return dims


def _expr(expr: Any, dims: dict[Any, list[Any]], where: str) -> Any:
    """A shape expression as JSON: an int, a ``["dim", input, axis]``, or
    ``[op, a, b]`` for op in ``_SHAPE_OPS``."""
    from tvm import tirx

    if _is_int(expr):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        if expr not in dims:
            raise DefopError(f"{where}: an output's size uses {expr}, which is no input's size")
        return dims[expr]
    kind = _SHAPE_OPS.get(type(expr).__name__)
    if kind is None:
        raise DefopError(f"{where}: an output's size is {expr}: sizes may use + - * // % min max of input sizes")
    return [kind, _expr(expr.a, dims, where), _expr(expr.b, dims, where)]


def _elementwise_inputs(output: Any, inputs: list[Any]) -> list[int]:
    """The inputs the output reads only at its own index (``A[i]`` for output
    element ``i``), unconditionally: those must have the output's shape. A read
    inside a branch (``if_then_else``, ``Select``) is the user's own guard's to
    keep in bounds."""
    from tvm.ir.expr import Call

    axes = [v.var for v in output.op.axis]
    aligned: dict[int, bool] = {}

    def visit(node: Any, guarded: bool) -> None:
        if isinstance(node, Call) and node.op.name == "te.tensor_load":
            tensor, indices = node.args[0], list(node.args[1:])
            for i, t in enumerate(inputs):
                if tensor.same_as(t):
                    at_own_index = len(indices) == len(axes) and all(a.same_as(b) for a, b in zip(indices, axes))
                    aligned[i] = aligned.get(i, True) and at_own_index and not guarded
            for index in indices:
                visit(index, guarded)
        elif isinstance(node, Call):
            branches = node.op.name == "prim.if_then_else"
            for k, arg in enumerate(node.args):
                visit(arg, guarded or (branches and k > 0))
        elif type(node).__name__ == "Select":
            visit(node.condition, guarded)
            visit(node.true_value, True)
            visit(node.false_value, True)
        else:
            for field in ("a", "b", "value", "condition"):
                if hasattr(node, field):
                    visit(getattr(node, field), guarded)
            for part in getattr(node, "source", ()):
                visit(part, guarded)

    for body in output.op.body:
        visit(body, False)
    return sorted(i for i, ok in aligned.items() if ok)


def _default_schedule(sch: Any, target: Any) -> Any:
    """The default CPU schedule: an elementwise variant's blocks computed inside
    its last, its outer loops in parallel, the last (contiguous) one left to
    LLVM's vectorizer, which takes a size known only at run time with a scalar
    tail (TVM's own vectorize needs a split, which a symbolic size turns into a
    predicate or, fused, into a division per element). A variant with a
    reduction: its first output axis in parallel. None (TVM's plain loop nests)
    where that does not apply."""
    from tvm import tirx

    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    try:
        if all(int(v.iter_type) == tirx.IterVar.DataPar for b in blocks for v in sch.get(b).iter_vars):
            for block in blocks[:-1]:
                sch.compute_inline(block)
            loops = sch.get_loops(blocks[-1])
            if not loops:
                return None
            # One loop: each thread's share of it is a contiguous run, vectorized.
            outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
            sch.parallel(outer)
            return sch
        last, loops = sch.get(blocks[-1]), sch.get_loops(blocks[-1])
        if loops and last.iter_vars and int(last.iter_vars[0].iter_type) == tirx.IterVar.DataPar:
            sch.parallel(loops[0])  # the first output axis; its reduction runs inside each task
        return sch
    except Exception:  # a loop nest the default does not fit: TVM's plain one is correct
        return None


#: Threads per CUDA block in the default GPU schedule.
CUDA_THREADS = 256
#: Threads that read neighbouring addresses: a reduction's parts are laid out along them.
CUDA_WARP = 32


def _cuda_schedule(sch: Any) -> Any:
    """The default CUDA schedule. The last block's other blocks are inlined into
    it, then its output axes are fused into one loop over every output element.
    Elementwise: a thread per element, ``CUDA_THREADS`` a block (``blockIdx.x``,
    ``threadIdx.x``). A reduction along the inputs' last axis (a row sum): a warp
    per element, ``CUDA_THREADS // CUDA_WARP`` elements a block
    (``threadIdx.y``), its ``CUDA_WARP`` threads (``threadIdx.x``) striding
    along the row. A reduction across memory (a column sum): ``CUDA_WARP``
    neighbouring elements a block (``threadIdx.x``), each summed in
    ``CUDA_THREADS // CUDA_WARP`` parts (``threadIdx.y``). Either way a warp
    reads contiguous memory and TVM's cross-thread reduction combines the
    parts; a thread per element reading its row, or a thread per column for
    few columns, was 19x and 9x slower on an H200. TVM refuses a kernel with a
    loop left unbound, so a variant this does not fit needs a ``schedule=``
    hook."""
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for block in blocks[:-1]:
        sch.compute_inline(block)
    last = blocks[-1]
    iter_vars = sch.get(last).iter_vars
    is_spatial = [int(v.iter_type) == tirx.IterVar.DataPar for v in iter_vars]
    loops = sch.get_loops(last)
    spatial = [loop for loop, s in zip(loops, is_spatial) if s]
    reduction = [loop for loop, s in zip(loops, is_spatial) if not s]
    if not spatial:
        raise DefopError("a full reduction (no output axis) has no default CUDA schedule: give schedule=")
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    if not reduction:
        blocks_x, threads_x = sch.split(fused, [None, CUDA_THREADS])
        sch.bind(blocks_x, "blockIdx.x")
        sch.bind(threads_x, "threadIdx.x")
        return sch
    reduced_vars = [v.var for v, s in zip(iter_vars, is_spatial) if not s]
    along_rows = any(var.same_as(r) for read in sch.get(last).reads
                     for var in undefined_vars(read.region[-1].min, []) for r in reduced_vars)
    reduced = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    if along_rows:
        blocks_x, rows_y = sch.split(fused, [None, CUDA_THREADS // CUDA_WARP])
        _, lanes_x = sch.split(reduced, [None, CUDA_WARP])
        sch.bind(blocks_x, "blockIdx.x")
        sch.bind(rows_y, "threadIdx.y")
        sch.bind(lanes_x, "threadIdx.x")
    else:
        blocks_x, columns_x = sch.split(fused, [None, CUDA_WARP])
        _, parts_y = sch.split(reduced, [None, CUDA_THREADS // CUDA_WARP])
        sch.bind(blocks_x, "blockIdx.x")
        sch.bind(columns_x, "threadIdx.x")
        sch.bind(parts_y, "threadIdx.y")
    return sch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tf_op_tvm.build_ops",
        description="Build every variant of every @defop of a Python file into one library, with its manifest.",
    )
    parser.add_argument("source", type=Path, help="the Python file declaring the defops")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the library to write (its manifest goes beside it)")
    parser.add_argument("--target", default="portable",
                        help="TVM's target (default: portable, a build per x86-64 level, the highest this CPU has loaded)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        manifest = build_ops(args.source, args.output, args.target)
    except DefopError as e:
        print(f"build_ops: {e}", file=sys.stderr)
        return 1
    count = sum(len(op["variants"]) for op in manifest["ops"].values())
    print(f"wrote {args.output} and {manifest_path(args.output)}: {len(manifest['ops'])} ops, {count} variants "
          f"({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
