"""Loops unrolled before a cluster of tf_op.auto (cluster.py), or a function
of tf_op.compile (compiled_function.py), is compiled.

A While (kernels/auto_loop_pass.cc takes whole recurrent layers into clusters)
compiles into TVM's VM as a loop that calls each step's kernels one by one:
about 12 µs a step for a Keras LSTM, most of it the VM's, not the kernels'.
Where the number of steps is known ahead and small, the While becomes that
many calls of its body in sequence, which TF's TFLite converter inlines: TVM
then compiles straight-line code, its memory planned once (the LSTM of 32
steps: 400 µs looped, 120 µs unrolled), at the cost of a longer compile (about
9 s for those 32 steps against 2 s).

A loop that writes each of its steps to a tensor list (a layer that returns
its whole sequence) compiles only unrolled: TF's TFLite converter makes the
write a SLICE of a size known only as the loop runs, which TVM 0.27's frontend
cannot take in a WHILE's subgraph. Such a loop that cannot be unrolled is
refused with that reason (a CompileError: TF runs it).

The number of steps is known ahead when the loop's condition reads only loop
variables whose every value follows from constants: a counter started at a
constant and stepped by the body from such variables alone (a Keras RNN's
step, ``time < steps``, and TF's own loop counter). The loop is then run once,
on zeros, for that number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from tf_op.compiler.errors import CompileError

#: The most steps a loop is unrolled for: TVM's compile grows with them.
MAX_STEPS = 64

_LOOPS = ("While", "StatelessWhile")


def unrolled(concrete: Any) -> Any:
    """``concrete`` (a ConcreteFunction of static input shapes) with its
    variables frozen into constants and its loops of known, few steps unrolled:
    what tf_op.compile converts, so that a Keras RNN compiles into straight-line
    code as tf_op.auto's clusters do. ``concrete`` itself where no loop is
    unrolled."""
    if not any(op.type in _LOOPS for op in concrete.graph.get_operations()):
        return concrete
    # Control flow stays While (not lowered to Switch and Merge): unroll reads the While.
    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)
    graph_def = frozen.graph.as_graph_def()
    specs = [tf.TensorSpec(t.shape, t.dtype, name=t.op.name) for t in frozen.inputs]
    renamed = unroll(graph_def, {spec.name: spec for spec in specs})
    if not renamed:
        return concrete
    return function_of(graph_def, [t.name for t in frozen.inputs],
                       rename([t.name for t in frozen.outputs], renamed), specs, scope="unrolled")


def function_of(graph_def: graph_pb2.GraphDef, inputs: Sequence[str], outputs: Sequence[str],
                specs: Sequence[tf.TensorSpec], scope: str) -> Any:
    """``graph_def`` as a ConcreteFunction of ``specs``: each fed to its tensor
    of ``inputs``, the tensors ``outputs`` returned. Its ops are named under
    ``scope``, which the compile errors that name an op show."""
    def body(*args: tf.Tensor) -> list[tf.Tensor]:
        return tf.graph_util.import_graph_def(graph_def, input_map=dict(zip(inputs, args)),
                                              return_elements=list(outputs), name=scope)

    return tf.function(body).get_concrete_function(*specs)


def unroll(graph_def: graph_pb2.GraphDef, args: Mapping[str, tf.TensorSpec]) -> dict[str, str]:
    """Unrolls, in place, each loop of ``graph_def`` (a cluster's graph; its
    functions in its library; ``args``: its Placeholders by name) that runs a
    known number of steps, at most MAX_STEPS. Returns the tensors renamed: each
    loop's output ``W:i`` by its last step's."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    renamed: dict[str, str] = {}
    for loop in [n for n in graph_def.node if n.op in _LOOPS]:
        body = functions.get(loop.attr["body"].func.name)
        cond = functions.get(loop.attr["cond"].func.name)
        steps = _count_steps(graph_def, loop, args) if body and cond and _steps_known(loop, cond, body, graph_def) \
            else None
        if steps is not None and 0 < steps <= MAX_STEPS:
            renamed.update(_replace(graph_def, loop, steps))
        elif body is not None and _writes_each_step(body):
            # TF's TFLite converter makes such a write a SLICE whose size is
            # known only as the loop runs, which TVM 0.27's frontend refuses in
            # a WHILE's subgraph (with a TypeError that names nothing of this).
            raise CompileError(f"the loop {loop.name} writes each of its steps (a layer that returns its whole "
                               f"sequence) and runs {'more than ' + str(MAX_STEPS) if steps else 'an unknown number of'}"
                               " steps: TVM's TFLite frontend takes such a loop only unrolled")
    return renamed


def _writes_each_step(body: function_pb2.FunctionDef) -> bool:
    """Whether the body writes a tensor list at an index that is not a constant."""
    constants = {n.name for n in body.node_def if n.op == "Const"}
    return any(n.op == "TensorListSetItem" and (len(n.input) < 2 or _node(n.input[1]) not in constants)
               for n in body.node_def)


def _steps_known(loop: node_def_pb2.NodeDef, cond: function_pb2.FunctionDef, body: function_pb2.FunctionDef,
                 graph_def: graph_pb2.GraphDef) -> bool:
    """Whether the loop's trip count follows from constants alone (see above)."""
    data = [i for i in loop.input if not i.startswith("^")]
    # TF's loops (while_v2) carry their step count first, from a constant.
    by_name = {n.name: n for n in graph_def.node}
    counter = by_name.get(_node(data[0]))
    if counter is None or counter.op != "Const" or not counter.name.endswith("loop_counter"):
        return False
    watched = _args_reached(cond, [cond.ret[a.name] for a in cond.signature.output_arg])
    while True:  # the variables the condition reads, and those each of their steps reads
        more = _args_reached(body, [body.ret[body.signature.output_arg[i].name] for i in watched]) - watched
        if not more:
            break
        watched |= more
    return all(_from_constants(by_name, _node(data[i])) for i in watched)


def _args_reached(f: function_pb2.FunctionDef, outputs: Iterable[str]) -> set[int]:
    """The indices of f's arguments the tensors ``outputs`` (FunctionDef names:
    ``arg`` or ``node:out:i``) are computed from."""
    args = {a.name: i for i, a in enumerate(f.signature.input_arg)}
    nodes = {n.name: n for n in f.node_def}
    reached: set[int] = set()
    stack, seen = [_node(o) for o in outputs], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in args:
            reached.add(args[name])
        elif name in nodes:
            stack.extend(_node(i) for i in nodes[name].input if not i.startswith("^"))
    return reached


def _from_constants(by_name: Mapping[str, node_def_pb2.NodeDef], name: str) -> bool:
    """Whether the node's value follows from constants: no argument of the
    graph, and no loop, above it."""
    stack, seen = [name], set()
    while stack:
        node = by_name.get(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op == "Placeholder" or node.op in _LOOPS:
            return False
        stack.extend(_node(i) for i in node.input)
    return True


def _count_steps(graph_def: graph_pb2.GraphDef, loop: node_def_pb2.NodeDef, args: Mapping[str, tf.TensorSpec]) -> int:
    """The loop's step count: its counter at the end of one run on zeros (in a
    graph and session of their own, which hold the loop's functions)."""
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        feed = {f"{name}:0": np.zeros(spec.shape, spec.dtype.as_numpy_dtype) for name, spec in args.items()}
        with tf.compat.v1.Session(graph=graph) as session:
            return int(session.run(f"{loop.name}:0", feed_dict=feed))


def _replace(graph_def: graph_pb2.GraphDef, loop: node_def_pb2.NodeDef, steps: int) -> dict[str, str]:
    """The loop as ``steps`` calls of its body, each taking the last's results."""
    types = loop.attr["T"]
    data = [i for i in loop.input if not i.startswith("^")]
    controls = [i for i in loop.input if i.startswith("^")]
    calls = []
    for step in range(steps):
        call = node_def_pb2.NodeDef(name=f"{loop.name}/tvmdsoop_step_{step}", op="PartitionedCall",
                                    device=loop.device)
        call.input.extend(data if step == 0 else [f"{calls[-1].name}:{i}" for i in range(len(types.list.type))])
        if step == 0:
            call.input.extend(controls)
        call.attr["Tin"].CopyFrom(types)
        call.attr["Tout"].CopyFrom(types)
        call.attr["f"].CopyFrom(loop.attr["body"])
        for name in ("config", "config_proto", "executor_type"):
            call.attr[name].CopyFrom(attr_value_pb2.AttrValue(s=b""))
        calls.append(call)
    last = calls[-1].name
    renamed = {f"{loop.name}:{i}": f"{last}:{i}" for i in range(len(types.list.type))}
    renamed[loop.name] = f"{last}:0"
    for node in graph_def.node:
        for k, name in enumerate(node.input):
            if name == f"^{loop.name}":
                node.input[k] = f"^{last}"
            elif name in renamed:
                node.input[k] = renamed[name]
    nodes = [n for n in graph_def.node if n.name != loop.name] + calls
    del graph_def.node[:]
    graph_def.node.extend(nodes)
    return renamed


def _node(tensor: str) -> str:
    """The node of a tensor's name (``node``, ``node:i``, ``node:out:i``, ``^node``)."""
    return tensor.lstrip("^").split(":")[0]


def rename(names: Sequence[str], renamed: Mapping[str, str]) -> list[str]:
    """``names`` (tensors of the graph) after ``unroll``'s renames."""
    return [renamed.get(n, renamed.get(n.removesuffix(":0"), n)) for n in names]
