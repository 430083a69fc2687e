"""``add_gradient``: a Relax function's gradient, in the form TVMDSOOp's gradient calls.

    from tf_op_tvm import add_gradient
    mod, params = MyModel().export_tvm(spec=...)        # or any Relax IRModule
    mod = add_gradient(mod, "forward")                  # adds forward_grad
    tvm.compile(mod, target="llvm").export_library("model.so")

then, in TensorFlow, ``tf_op.ModelLayer("model.so", "forward", grad="forward_grad",
params=...)`` or ``tf_op.Module("model.so").func("forward", ..., grad="forward_grad")``.
"""

from __future__ import annotations

import tvm
from tvm import relax

__all__ = ["add_gradient"]


def _leaf_types(ty: relax.Type) -> list[relax.TensorType]:
    """The tensors of a (possibly nested) tuple, depth first: the order in which
    TVMDSOOp flattens what a function returns."""
    if isinstance(ty, relax.TupleType):
        return [leaf for field in ty.fields for leaf in _leaf_types(field)]
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"tf_op_tvm: a function returning {ty} is not differentiable: tensors and tuples of them are")
    return [ty]


def _leaves(bb: relax.BlockBuilder, value: relax.Expr, ty: relax.Type) -> list[relax.Expr]:
    """The tensors of value, in _leaf_types' order."""
    if isinstance(ty, relax.TupleType):
        return [leaf for i, field in enumerate(ty.fields) for leaf in _leaves(bb, bb.emit(relax.TupleGetItem(value, i)), field)]
    return [value]


def _differentiable(var: relax.Var) -> bool:
    return isinstance(var.ty, relax.TensorType) and str(var.ty.dtype).startswith(("float", "bfloat"))


def add_gradient(mod: tvm.IRModule, func_name: str, grad_name: str | None = None) -> tvm.IRModule:
    """Adds the gradient of Relax function ``func_name`` to ``mod``, in the form
    that TVMDSOOp's gradient calls (docs/usage.md, "Training"):

        grad(*inputs, *outputs, *upstream_grads) -> (one gradient per floating-point input)

    ``relax.transform.Gradient`` differentiates scalars only, so the gradient is
    that of the vector-Jacobian product ``sum_i sum(outputs_i * upstream_i)`` with
    respect to the floating-point inputs (a model's weights are inputs: nn's
    ``export_tvm`` appends them). ``Gradient`` returns ``(value, (grads...))``; the
    function added returns the grads only. Two helpers stay beside it,
    ``{grad_name}_vjp_adjoint`` (which it calls) and ``{grad_name}_vjp``.

    The function must be one that ``Gradient`` can differentiate: a single dataflow
    block (what TVM's frontends make) of operators that TVM has gradients for.

    Args:
      mod: the IRModule holding the function; not changed.
      func_name: the function to differentiate.
      grad_name: the name of the gradient function; ``{func_name}_grad`` by default.
    Returns:
      a new IRModule with the gradient function added.
    """
    grad_name = grad_name or f"{func_name}_grad"
    vjp_name = f"{grad_name}_vjp"
    func_var = mod.get_global_var(func_name)
    func = mod[func_var]
    inputs = [relax.Var(p.name, p.ty) for p in func.params]
    wanted = [k for k, x in enumerate(inputs) if _differentiable(x)]
    if not wanted:
        raise ValueError(f"tf_op_tvm: {func_name} has no floating-point input to differentiate")
    out_types = _leaf_types(func.ret_ty)
    outputs = [relax.Var(f"output{i}", ty) for i, ty in enumerate(out_types)]
    upstream = [relax.Var(f"upstream{i}", ty) for i, ty in enumerate(out_types)]

    # vjp(*inputs, *outputs, *upstream): the outputs are unused, the contract passes
    # them for gradients that want them. The call is inlined below: Gradient wants
    # the operators in one dataflow block.
    bb = relax.BlockBuilder()
    with bb.function(vjp_name, [*inputs, *outputs, *upstream]):
        with bb.dataflow():
            result = bb.emit(relax.Call(func_var, inputs))
            total = None
            for value, dy in zip(_leaves(bb, result, func.ret_ty), upstream):
                term = bb.emit(relax.op.sum(relax.op.multiply(value, dy)))
                total = term if total is None else bb.emit(relax.op.add(total, term))
            target = bb.emit_output(total)
        bb.emit_func_output(target)
    vjp = bb.get()[vjp_name].inline_functions({func_var: func})

    out = mod.clone()  # the caller's module stays as it was
    out[vjp_name] = vjp
    out = relax.transform.Gradient(vjp_name, require_grads=[vjp.params[k] for k in wanted])(out)
    adjoint_var = out.get_global_var(f"{vjp_name}_adjoint")
    params = [relax.Var(p.name, p.ty) for p in vjp.params]
    bb = relax.BlockBuilder(out)
    with bb.function(grad_name, params):
        value_and_grads = bb.emit(relax.Call(adjoint_var, params))
        bb.emit_func_output(bb.emit(relax.TupleGetItem(value_and_grads, 1)))
    return bb.get()
