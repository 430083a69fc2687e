"""The worker's default CPU schedules for matrix products and the transformer
block around them (python/tf_op_tvm/cpu_schedule: matmul, reduction,
elementwise) and its float32 erf: which loop nests the rules take, and that
the libraries still compute what Keras does, on each x86-64 level."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TVM_PYTHON
from helpers import run_tvm_script
from test_compiler import _HOST_FLAGS, TVM_PACKAGE

from tf_op import compile
from tf_op.compiler import unroll
from tf_op.compiler.tflite_conversion import to_tflite

#: The goal for untuned CPU code: within 1e-4 of Keras, relative to the output's largest value.
RELATIVE = 1e-4

TARGETS = [
    pytest.param({"kind": "llvm", "mcpu": "x86-64"}, id="x86-64"),
    pytest.param({"kind": "llvm", "mcpu": "x86-64-v3"}, id="x86-64-v3",
                 marks=pytest.mark.skipif(not {"avx2", "fma"} <= _HOST_FLAGS, reason="runs an AVX2 library")),
    pytest.param({"kind": "llvm", "mcpu": "x86-64-v4"}, id="x86-64-v4",
                 marks=pytest.mark.skipif("avx512f" not in _HOST_FLAGS, reason="runs an AVX-512 library")),
]


def _transformer() -> keras.Model:
    """An encoder block: 4-head self-attention, layer norms, and a feed-forward
    layer with exact (erf) GELU, residuals around both."""
    keras.utils.set_random_seed(0)
    x = keras.Input((64, 128))
    attention = keras.layers.MultiHeadAttention(4, 32)(x, x)
    h = keras.layers.LayerNormalization()(x + attention)
    f = keras.layers.Dense(512, activation=lambda t: tf.nn.gelu(t, approximate=False))(h)
    return keras.Model(x, keras.layers.LayerNormalization()(h + keras.layers.Dense(128)(f)))


def _lstm() -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((32, 16)), keras.layers.LSTM(64), keras.layers.Dense(10)])


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(2)
    return keras.Sequential([keras.Input((100,)), keras.layers.Dense(48, activation="relu"),
                             keras.layers.Dense(40, activation="tanh"), keras.layers.Dense(10)])


def _classifier() -> keras.Model:
    """A classifier head: 256 -> 512 (relu) -> 1000, the last layer's 1000
    columns not whole vectors of AVX-512's 16."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(1000)])


def _squeeze_excite() -> keras.Model:
    """EfficientNet's squeeze-and-excitation: a swish expansion, a gate from its
    pooled channels (two 1x1 convolutions, swish then sigmoid), and the
    expansion times the gate. 48 channels: whole vectors on every level."""
    keras.utils.set_random_seed(4)
    x = keras.Input((14, 14, 16))
    h = keras.layers.Conv2D(48, 1, activation="swish")(x)
    g = keras.layers.GlobalAveragePooling2D(keepdims=True)(h)
    g = keras.layers.Conv2D(8, 1, activation="swish")(g)
    g = keras.layers.Conv2D(48, 1, activation="sigmoid")(g)
    return keras.Model(x, keras.layers.Multiply()([h, g]))


def _stateless(model: keras.Model, shape: tuple[int, ...]) -> tuple[Any, list[tf.TensorSpec], list[np.ndarray]]:
    """``model`` as a function of its input and its weights (Keras 3's
    ``stateless_call``), that function's signature, and the weights' values:
    the weights are the function's inputs, as tf_op.auto's clusters get the
    Keras variables that TF reads."""
    weights = [*model.trainable_variables, *model.non_trainable_variables]
    split = len(model.trainable_variables)

    def call(x: tf.Tensor, *values: tf.Tensor) -> tf.Tensor:
        return model.stateless_call(list(values[:split]), list(values[split:]), x, training=False)[0]

    specs = [tf.TensorSpec(shape, tf.float32), *(tf.TensorSpec(w.shape, w.dtype) for w in weights)]
    return call, specs, [w.numpy() for w in weights]


def _inputs(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error <= RELATIVE, error


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("make_model, shape", [(_transformer, (64, 128)), (_lstm, (32, 16)), (_mlp, (100,)),
                                               (_squeeze_excite, (14, 14, 16))],
                         ids=["transformer", "lstm", "mlp", "squeeze_excite"])
@pytest.mark.parametrize("batch", [1, 3])
def test_scheduled_models_match_keras(make_model, shape: tuple[int, ...], batch: int,
                                      target: dict[str, str], tmp_path: Path) -> None:
    """Batch 3: no dimension a multiple of the tiles' rows (8 x 64 rows are)."""
    model, x = make_model(), _inputs(batch, *shape)
    y = compile(model, target=target, cache_dir=tmp_path, batch_sizes=[batch])(x)
    _assert_close(y.numpy(), model(x).numpy())


#: Run on the TVM Python: the rule (class name) that takes each of a TFLite
#: model's loop nests (PrimFuncs, after compile_model's Relax rewrites and
#: fusion), or null where none does, and the nests it splits over TVM's threads.
_RULES_TAKEN = """
import json, sys
from pathlib import Path
import tvm
from tvm import tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu
sys.path.insert(0, sys.argv[1])
import compile_model, cpu_schedule
target = tvm.target.Target(json.loads(sys.argv[3]))
mod = compile_model.import_tflite(Path(sys.argv[2]).read_bytes())
with target:
    mod = tvm.transform.Sequential([*compile_model.model_rewrites(lambda _: None), *cpu.library_dispatch_passes(target),
                                    *cpu.legalize_passes(target)])(mod)
taken, threaded = {}, []
for gvar, func in mod.functions.items():
    if isinstance(func, tirx.PrimFunc):
        rule, sch = next(((r, sch) for r in cpu_schedule.rules(target)
                          if (sch := r.apply(func, target, False)) is not None), (None, None))
        taken[gvar.name_hint] = type(rule).__name__ if rule else None
        if sch is not None and "T.parallel(" in sch.mod["main"].script():
            threaded.append(gvar.name_hint)
print(json.dumps({"taken": taken, "threaded": threaded}))
"""


def _rules_taken(model: keras.Model, shape: tuple[int, ...], target: dict[str, str], tmp_path: Path) -> dict[str, str]:
    concrete = tf.function(lambda t: model(t)).get_concrete_function(tf.TensorSpec(shape, tf.float32))
    return _rules_taken_by(concrete, target, tmp_path)


def _rules_taken_by(concrete: Any, target: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return _scheduled(concrete, target, tmp_path)["taken"]


def _scheduled(concrete: Any, target: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    """``taken``: the rule of each loop nest; ``threaded``: the nests on TVM's threads."""
    path = tmp_path / "model.tflite"
    path.write_bytes(to_tflite(concrete, "model"))
    return run_tvm_script(_RULES_TAKEN, str(TVM_PACKAGE), str(path), json.dumps(target), timeout=300)


@pytest.mark.parametrize("target", [{"kind": "llvm", "mcpu": m} for m in ("x86-64", "x86-64-v3", "x86-64-v4")],
                         ids=["x86-64", "x86-64-v3", "x86-64-v4"])
def test_rules_take_the_transformer_blocks_loop_nests(target: dict[str, str], tmp_path: Path) -> None:
    """Every matrix product of the block (projections, Q K^T, attention times
    V, the feed-forward layers, these with their bias and GELU: the reshapes
    between them merged away) is register-tiled, softmax and the layer norms'
    layer norms are row reductions, each one function, and the elementwise work between them
    (transposes, residual adds) is one vectorized loop. The one loop nest left
    to the fallback is a plain reshape, which Relax runs as a view of its input
    (RewriteDataflowReshape), with no kernel at all, when it is left
    unscheduled."""
    taken = _rules_taken(_transformer(), (8, 64, 128), target, tmp_path)
    matmuls = [name for name in taken if "matmul" in name]
    assert len(matmuls) == 6 and {taken[name] for name in matmuls} == {"Matmul"}, taken
    assert taken["softmax"] == "RowReduction", taken
    # The two layer norms (one function: the same shapes), no mean apart.
    layer_norms = [name for name in taken if "mean" in name]
    assert len(layer_norms) == 1 and taken[layer_norms[0]] == "RowReduction", taken
    assert "rsqrt" in layer_norms[0] and "multiply" in layer_norms[0], taken
    assert [taken[name] for name in taken if "erf" in name] == ["Matmul"], taken
    # The plain reshapes, which Relax runs as views: the scores' (after their
    # product and its scale) among them.
    assert {taken[name] for name in taken if name.startswith("reshape")} == {None}, taken
    assert [name for name, rule in taken.items() if rule is None and not name.startswith("reshape")] == [], taken


def test_the_attentions_scale_is_its_scores_products_epilogue(tmp_path: Path) -> None:
    """Keras's attention scales its scores after their product, which TFLite
    reshapes from (batch x heads, T, T) to (batch, heads, T, T) in between:
    the scale is moved before the reshape (``scaled_products``), so it runs
    on the product's tiles instead of as a kernel of its own, and the reshape
    is a view. The values are the same to the bit (checked against Keras in
    test_scheduled_models_match_keras)."""
    taken = _rules_taken(_transformer(), (8, 64, 128), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    scaled = [name for name in taken if "matmul" in name and "multiply" in name and "erf" not in name]
    assert [taken[name] for name in scaled] == ["Matmul"], taken
    assert [name for name in taken if "multiply" in name and "matmul" not in name and "mean" not in name] == [], taken


def test_a_scale_moves_before_a_reshape_only_when_it_is_a_scalar() -> None:
    """The pass's cases: a scalar, on either side, moves; a vector (which
    broadcasts along the reshaped axes) does not."""
    out = run_tvm_script(_SCALE_CASES, str(TVM_PACKAGE.parent), timeout=300)
    assert out == {"scalar": True, "scalar first": True, "vector": False}, out


#: Run on the TVM Python: ``multiply(reshape(matmul(a, b)), c)`` through the
#: pass, for a scalar c after and before, and a vector c: whether the multiply
#: now comes before the reshape, and that the values did not change.
_SCALE_CASES = """
import json, sys
import numpy as np, tvm
from tvm import relax
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import scaled_products
rng, out = np.random.default_rng(0), {}
a, b = rng.standard_normal((4, 8, 16)).astype("float32"), rng.standard_normal((4, 16, 8)).astype("float32")
for case, c in (("scalar", np.float32(0.177)), ("scalar first", np.float32(0.177)),
                ("vector", rng.standard_normal(8).astype("float32"))):
    av, bv = relax.Var("a", relax.TensorType(a.shape, "float32")), relax.Var("b", relax.TensorType(b.shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [av, bv]):
        with bb.dataflow():
            r = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(av, bv)), (2, 2, 8, 8)))
            scale = relax.const(c)
            y = bb.emit_output(bb.emit(relax.op.multiply(scale, r) if case == "scalar first" else relax.op.multiply(r, scale)))
        bb.emit_func_output(y)
    before = bb.get()
    after = scaled_products.scale_before_reshape()(before)
    ops = [binding.value.op.name for binding in after["main"].body.blocks[0].bindings if hasattr(binding.value, "op")]
    results = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy() for m in (before, after)]
    assert np.array_equal(*results), case
    out[case] = ops.index("relax.multiply") < ops.index("relax.reshape")
print(json.dumps(out))
"""


def _layer_norm(center: bool, scale: bool, epsilon: float) -> keras.Model:
    """A layer norm whose gamma and beta are not Keras's initial ones and 1
    (TFLite folds those away)."""
    keras.utils.set_random_seed(4)
    layer = keras.layers.LayerNormalization(center=center, scale=scale, epsilon=epsilon)
    model = keras.Sequential([keras.Input((24, 96)), layer])
    for weight in layer.weights:
        weight.assign(np.random.default_rng(5).uniform(0.5, 1.5, weight.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("center, scale, epsilon", [(True, True, 1e-3), (True, False, 1e-3), (False, True, 1e-3),
                                                    (True, True, 1e-12)],
                         ids=["centred-scaled", "centred", "scaled", "bert-epsilon"])
def test_layer_norms_are_one_row_reduction(center: bool, scale: bool, epsilon: float, tmp_path: Path) -> None:
    """TFLite spells a layer norm out in a dozen ops, which FuseOps made four
    kernels (it cuts at each reduction): each of the converter's forms, with and
    without gamma and beta, is one function (layer_norms), which the row
    reduction rule schedules; its values Keras's within float32 rounding, on
    inputs whose rows' means are far from 0 (the variance of x - mean)."""
    model = _layer_norm(center, scale, epsilon)
    taken = _rules_taken(model, (3, 24, 96), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    assert len(taken) == 1 and list(taken.values()) == ["RowReduction"], taken
    x = _inputs(3, 24, 96) + 10.0
    _assert_close(compile(model, cache_dir=tmp_path, batch_sizes=[3])(x).numpy(), model(x).numpy())


#: Run on the TVM Python: layer_norms' squares rewrite on powers by a scalar
#: 2, a scalar 3 and a tensor of 2s (which broadcasts x): the ops left, and
#: the outputs against the module's before it, to the bit.
_SQUARES = """
import json, sys
import numpy as np, tvm
from tvm import relax
sys.path.insert(0, sys.argv[1])
import layer_norms
x = relax.Var("x", relax.TensorType((3, 4), "float32"))
bb = relax.BlockBuilder()
with bb.function("main", [x]):
    with bb.dataflow():
        two = bb.emit(relax.op.power(x, relax.const(2.0, "float32")))
        three = bb.emit(relax.op.power(x, relax.const(3.0, "float32")))
        twos = bb.emit(relax.op.power(x, relax.const(np.full((2, 3, 4), 2.0, "float32"))))
        out = bb.emit_output(relax.Tuple([two, three, twos]))
    bb.emit_func_output(out)
before = bb.get()
after = layer_norms._squares()(before)
ops = []
relax.analysis.post_order_visit(after["main"], lambda e: isinstance(e, relax.Call) and ops.append(e.op.name))
data = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
def run(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [o.numpy() for o in vm["main"](tvm.runtime.tensor(data))]
same = all(np.array_equal(a, b) for a, b in zip(run(before), run(after), strict=True))
print(json.dumps({"ops": ops, "same": same}))
"""


def test_squares_become_products_only_for_a_scalar_two() -> None:
    out = run_tvm_script(_SQUARES, str(TVM_PACKAGE))
    assert out["ops"] == ["relax.multiply", "relax.power", "relax.power"] and out["same"], out


def test_rules_take_the_lstms_step_and_the_dense_layers(tmp_path: Path) -> None:
    """The LSTM's step (its input and recurrent products, the first with the
    bias adds fused) and the classifier are register-tiled."""
    taken = _rules_taken(_lstm(), (8, 32, 16), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    assert sorted(name for name, rule in taken.items() if rule == "Matmul") == [
        "fused_matmul1_add_add1", "matmul", "matmul2"], taken


def test_the_unrolled_lstms_gates_fuse_with_the_parts_of_their_split(tmp_path: Path) -> None:
    """Each step of the LSTM, unrolled as tf_op.compile unrolls it, splits its
    gate pre-activations into four: each part becomes a slice that fuses into
    the kernel using it (split_slices), where a split was a kernel of its own."""
    model = _lstm()
    concrete = tf.function(lambda t: model(t)).get_concrete_function(tf.TensorSpec((1, 32, 16), tf.float32))
    taken = _rules_taken_by(unroll.unrolled(concrete), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    assert not [name for name in taken if "split" in name], taken
    assert [name for name in taken if "strided_slice" in name and "sigmoid" in name], taken


def test_the_unrolled_lstms_steps_slice_one_product_of_their_inputs(tmp_path: Path) -> None:
    """At batch 1, each step of the unrolled LSTM multiplied its own input row by
    the input weights, after a take kernel of its own: one product of every
    step's input now computes them all, and each step's kernel reads its row
    of it (stacked_products)."""
    model = _lstm()
    concrete = tf.function(lambda t: model(t)).get_concrete_function(tf.TensorSpec((1, 32, 16), tf.float32))
    taken = _rules_taken_by(unroll.unrolled(concrete), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    assert not [name for name in taken if "take" in name], taken
    assert len([name for name in taken if "strided_slice" in name and "add" in name]) >= 31, taken


def test_the_lstms_steps_at_batch_8_add_their_slice_in_their_products_kernel(tmp_path: Path) -> None:
    """At batch 8 (a register tile of rows), the steps' input products are one
    stacked product too, which stays on one thread (it runs among the serial
    steps), and each step's slice of it, its recurrent product and its bias
    are one loop nest the matmul rule takes (stacked_products.group_steps),
    where FuseOps had left the slice a kernel of its own."""
    model = _lstm()
    concrete = tf.function(lambda t: model(t)).get_concrete_function(tf.TensorSpec((8, 32, 16), tf.float32))
    found = _scheduled(unroll.unrolled(concrete), {"kind": "llvm", "mcpu": "x86-64-v3"}, tmp_path)
    taken = found["taken"]
    assert not [name for name in taken if "take" in name], taken
    stacked = [name for name in taken if name.startswith("stacked_product")]
    assert len(stacked) == 1 and taken[stacked[0]] == "Matmul" and stacked[0] not in found["threaded"], found
    steps = [name for name in taken if "strided_slice" in name and "matmul" in name]
    assert len(steps) >= 1 and {taken[name] for name in steps} == {"Matmul"}, taken
    # Slices of it in no product's nest (nor a gate's): the first step's alone, which has no recurrent product.
    alone = [name for name in taken if "strided_slice" in name and "reshape" in name
             and "matmul" not in name and "sigmoid" not in name]
    assert len(alone) == 1, taken


_STEPS = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R
import stacked_products

@I.ir_module
class Steps:
    @R.function
    def main(x: R.Tensor((4, 1, 3), "float32"), w: R.Tensor((3, 5), "float32"), v: R.Tensor((3, 5), "float32"),
             y: R.Tensor((4, 8, 3), "float32"), z: R.Tensor((4, 9, 3), "float32")):
        with R.dataflow():
            a0 = R.matmul(R.take(x, R.const(0, "int32"), axis=0), w)
            a1 = R.matmul(R.take(x, R.const(1, "int32"), axis=0), w)
            a3 = R.matmul(R.take(x, R.const(3, "int32"), axis=0), w)
            b2 = R.matmul(R.take(x, R.const(2, "int32"), axis=0), v)
            c0 = R.matmul(R.take(y, R.const(0, "int32"), axis=0), w)
            c1 = R.matmul(R.take(y, R.const(1, "int32"), axis=0), w)
            e0 = R.matmul(R.take(z, R.const(0, "int32"), axis=0), w)
            e1 = R.matmul(R.take(z, R.const(1, "int32"), axis=0), w)
            d0 = R.matmul(R.take(x, R.const(0, "int32"), axis=2), R.const(np.ones((1, 5), "float32")))
            d1 = R.matmul(R.take(x, R.const(1, "int32"), axis=2), R.const(np.ones((1, 5), "float32")))
            R.output(a0, a1, a3, b2, c0, c1, d0, d1, e0, e1)
        return (a0, a1, a3, b2, c0, c1, d0, d1, e0, e1)

stacked = stacked_products.stack_sliced_products(Steps)
ops = {}
def record(call):
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        ops[call.op.name] = ops.get(call.op.name, 0) + 1
relax.analysis.post_order_visit(stacked["main"], record)
nests = [dict(f.attrs) for f in stacked.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
marked = [sorted(k for k in attrs if k.startswith("tvmdsoop.")) for attrs in nests]
rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype("float32") for s in ((4, 1, 3), (3, 5), (3, 5), (4, 8, 3), (4, 9, 3))]
def run(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [o.numpy() for o in vm["main"](*[tvm.runtime.tensor(a) for a in args])]
same = all(np.array_equal(a, b) for a, b in zip(run(Steps), run(stacked), strict=True))
print(json.dumps({"ops": ops, "same": same, "marked": marked}))
"""


def test_products_of_slices_of_one_tensor_by_one_matrix_become_one_product(tmp_path: Path) -> None:
    """Three of x's four rows by w: one product of x, sliced (and the outputs
    the same to the bit); two of y's, of 8 rows each (a register tile's
    worth), too. Each stacked product is a loop nest of its own, marked for
    group_steps and to stay on one thread. Left as they were: one row of x by
    v (a quarter of the rows), products of 9 rows each (more than a register
    tile: z), and slices along the axis the products sum over (d)."""
    script = tmp_path / "steps.py"  # TVMScript reads its source: a file, not -c
    script.write_text(_STEPS)
    result = subprocess.run([TVM_PYTHON, str(script), str(TVM_PACKAGE)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["same"]
    assert found["ops"]["relax.call_tir"] == 2, found  # a's and c's stacked products
    assert found["marked"] == [["tvmdsoop.one_thread", "tvmdsoop.stacked_product"]] * 2, found
    assert found["ops"]["relax.matmul"] == 1 + 2 + 2, found  # b, d and e as they were
    assert found["ops"]["relax.take"] == 1 + 2 + 2, found
    assert found["ops"]["relax.strided_slice"] == 3 + 2, found


_SPLITS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T
import split_slices

@I.ir_module
class Splits:
    @R.function
    def main(x: R.Tensor((2, 12), "float32"), y: R.Tensor((6, 5), "float32"), n: R.Shape(["k"])):
        k = T.int64()
        with R.dataflow():
            thirds = R.split(x, 3, axis=-1)
            a = R.add(thirds[0], thirds[2])
            rows = R.split(y, [2, 9], axis=0)
            b = rows[1]
            c = rows[2]
            kept = R.split(y, 5, axis=1)
            d = kept[4]
            z = R.zeros(R.shape([k, 4]), "float32")
            dynamic = R.split(z, 2, axis=0)
            e = dynamic[1]
            R.output(a, b, c, d, e, kept)
        return (a, b, c, d, e, kept)

out = {}
def ints(tup):  # a strided_slice's axes, begin or end: a tuple of PrimValues
    return [int(field.value) for field in tup.fields]
def record(call):
    if isinstance(call, relax.Call) and call.op.name in ("relax.split", "relax.strided_slice"):
        args = [ints(a) for a in call.args[1:4]] if call.op.name == "relax.strided_slice" else []
        out.setdefault(call.op.name, []).append(args)
relax.analysis.post_order_visit(split_slices.split_to_slices(Splits)["main"], record)
print(json.dumps(out))
"""


def test_split_parts_become_slices_where_the_extent_is_static(tmp_path: Path) -> None:
    """Sections and numpy's indices (clamped to the extent) become slices; a split
    along a dimension known only at run time stays, as does one whose tuple is
    used whole (beside its parts' slices)."""
    script = tmp_path / "splits.py"  # TVMScript reads its source: a file, not -c
    script.write_text(_SPLITS)
    result = subprocess.run([TVM_PYTHON, str(script), str(TVM_PACKAGE)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert sorted(found["relax.strided_slice"]) == sorted([
        [[1], [0], [4]], [[1], [8], [12]],  # thirds[0], thirds[2]
        [[0], [2], [6]], [[0], [6], [6]],  # rows[1], rows[2]: [2, 9] clamped to 6
        [[1], [4], [5]],  # kept[4], beside its split
    ])
    assert len(found["relax.split"]) == 2  # kept's, used whole, and the dynamic one


@pytest.mark.parametrize("target", TARGETS)
def test_gated_elementwise_takes_the_squeeze_excitation_gate(target: dict[str, str], tmp_path: Path) -> None:
    """The gate's last function (its 8 to 48 convolution, the sigmoid, and the
    expansion times the gate) is GatedElementwise's: the gate stays a loop
    nest of its own, computed once, not once per pixel."""
    taken = _rules_taken(_squeeze_excite(), (1, 14, 14, 16), target, tmp_path)
    gated = [name for name, rule in taken.items() if rule == "GatedElementwise"]
    assert len(gated) == 1 and "sigmoid" in gated[0] and "multiply" in gated[0], taken


@pytest.mark.parametrize("target", TARGETS)
def test_dense_layers_whose_weights_are_inputs(target: dict[str, str], tmp_path: Path) -> None:
    """Weights as inputs: no kernel copies them, both layers are
    register-tiled, the 1000-wide one with its bias (an input too) in whole
    vectors of 8 where the registers hold 16 (AVX-512), never taken for a row
    reduction (which read its weight down the columns), and the values are
    Keras's."""
    model = _classifier()
    call, specs, weights = _stateless(model, (2, 256))
    taken = _rules_taken_by(tf.function(call).get_concrete_function(*specs), target, tmp_path)
    assert not [name for name in taken if "transpose" in name], taken
    assert [rule for name, rule in taken.items() if "relu" in name] == ["Matmul"], taken
    assert [rule for name, rule in taken.items() if "matmul" in name and "relu" not in name] == ["Matmul"], taken
    assert "RowReduction" not in taken.values(), taken
    x = _inputs(2, 256)
    y = compile(call, specs, target=target, cache_dir=tmp_path)(x, *weights)
    _assert_close(y.numpy(), model(x).numpy())


def test_transformer_block_whose_weights_are_inputs(tmp_path: Path) -> None:
    """Weights as inputs: the broadcasts TVM's frontend puts in front of a
    BATCH_MATMUL by a 2-D weight (copies of the weight) become views, every
    product is register-tiled, and the values are Keras's."""
    model = _transformer()
    call, specs, weights = _stateless(model, (2, 64, 128))
    target = {"kind": "llvm", "mcpu": "x86-64-v3" if {"avx2", "fma"} <= _HOST_FLAGS else "x86-64"}
    taken = _rules_taken_by(tf.function(call).get_concrete_function(*specs), target, tmp_path)
    assert not [name for name in taken if "broadcast" in name or "transpose" in name and "matmul" in name], taken
    assert {rule for name, rule in taken.items() if "matmul" in name} == {"Matmul"}, taken
    x = _inputs(2, 64, 128)
    y = compile(call, specs, target=target, cache_dir=tmp_path)(x, *weights)
    _assert_close(y.numpy(), model(x).numpy())


#: Run on the TVM Python: the Elementwise rule on transpositions and on
#: injective work that reads along the output's rows, for the target of
#: argv[2]: the kinds and extents of each one's innermost two loops, whether
#: it runs on TVM's threads, and whether it computes numpy's values.
_TRANSPOSITIONS = """
import json, sys
import numpy as np, tvm
from tvm import te, tirx, topi
sys.path.insert(0, sys.argv[1])
from cpu_schedule import elementwise
target = tvm.target.Target(json.loads(sys.argv[2]))
def keys(batch, tokens, heads, width):  # attention's K: its heads' dimension after the tokens'
    k = te.placeholder((batch, tokens, heads * width), name="k")
    split = topi.reshape(k, (batch, tokens, heads, width))
    return [k], topi.reshape(topi.transpose(split, (0, 2, 3, 1)), (batch * heads, width, tokens)), \
        lambda a: a.reshape(batch, tokens, heads, width).transpose(0, 2, 3, 1).reshape(batch * heads, width, tokens)
x = te.placeholder((2, 56, 56, 64), name="x")
bias = te.placeholder((64,), name="bias")
k, scores = te.placeholder((1, 128, 768), name="k"), te.placeholder((64, 64), name="m")
wrapping = te.placeholder((8, 64, 6), name="w")
cases = {
    "keys": keys(1, 128, 12, 64),  # BERT-base's, 98304 elements
    "batched_keys": keys(2, 128, 12, 64),  # its batch and heads one dimension
    "small_keys": keys(1, 64, 4, 32),  # the transformer block's, 8192
    "nhwc_to_nchw": ([x], topi.transpose(x, (0, 3, 1, 2)), lambda a: a.transpose(0, 3, 1, 2)),
    "nchw_with_bias": ([x, bias], te.compute((2, 64, 56, 56), lambda n, c, h, w: x[n, h, w, c] + bias[c]),
                       lambda a, b: a.transpose(0, 3, 1, 2) + b[:, None, None]),
    "scaled_keys": ([k], te.compute((12, 64, 128), lambda h, d, t: k[0, t, h * 64 + d] * 0.125),
                    lambda a: a[0].reshape(128, 12, 64).transpose(1, 2, 0) * np.float32(0.125)),
    # Q and V: their heads apart, each row still read contiguously
    "queries": ([k], topi.reshape(topi.transpose(topi.reshape(k, (1, 128, 12, 64)), (0, 2, 1, 3)), (12, 128, 64)),
                lambda a: a[0].reshape(128, 12, 64).transpose(1, 0, 2)),
    # one read transposed, the other along the rows
    "mixed": ([scores], te.compute((64, 64), lambda i, j: scores[j, i] + scores[i, j]), lambda a: a.T + a),
    # contiguous in runs of 6, which no tile fits
    "wrapping": ([wrapping], te.compute((48, 64), lambda i, j: wrapping[i // 6, j, i % 6]),
                 lambda a: a.transpose(0, 2, 1).reshape(48, 64)),
}
kinds = {tirx.ForKind.SERIAL: "serial", tirx.ForKind.PARALLEL: "parallel", tirx.ForKind.VECTORIZED: "vectorized",
         tirx.ForKind.UNROLLED: "unrolled"}
out = {}
for name, (inputs, result, reference) in cases.items():
    sch = elementwise.Elementwise().apply(te.create_prim_func([*inputs, result]), target, False)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])]
    data = [np.random.default_rng(0).standard_normal([int(d) for d in t.shape]).astype("float32") for t in inputs]
    want = reference(*data)
    got = tvm.runtime.tensor(np.zeros(want.shape, "float32"))
    tvm.compile(sch.mod, target=target)(*[tvm.runtime.tensor(d) for d in data], got)
    out[name] = {"tail": [[int(l.extent), kinds[l.kind]] for l in loops[-2:]],
                 "parallel": any(l.kind == tirx.ForKind.PARALLEL for l in loops),
                 "equal": bool(np.array_equal(got.numpy(), want))}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target, tile", [pytest.param(target.values[0], tile, marks=target.marks, id=target.id)
                                          for target, tile in zip(TARGETS, (4, 8, 16))])
def test_transpositions_run_in_square_tiles(target: dict[str, str], tile: int) -> None:
    """A transposition's output rows gather each lane of a vector from another
    row of its input (BERT-base's K: 88 µs; in tiles 9.4 on AVX-512, 10.5
    on AVX2, 20 on SSE2); it runs in square tiles of a vector's width instead,
    each read in vectors along its input's rows, 8 wide where 16 does not
    divide the rows (NHWC to NCHW, 56 wide), with a bias or a scale, its
    batch and heads one dimension or not, on TVM's threads from 64K elements.
    Work that reads along the output's rows (Q and V's heads apart, or one of
    two inputs), and a read contiguous in runs no tile fits, stays one
    vectorized loop of two vectors. The values are numpy's, exactly."""
    out = run_tvm_script(_TRANSPOSITIONS, str(TVM_PACKAGE), json.dumps(target), timeout=300)
    assert all(case["equal"] for case in out.values()), out
    tiled = {name: case["tail"] for name, case in out.items() if case["tail"][-2][1] == "unrolled"}
    assert tiled == {"keys": [[tile, "unrolled"], [tile, "vectorized"]],
                     "batched_keys": [[tile, "unrolled"], [tile, "vectorized"]],
                     "small_keys": [[tile, "unrolled"], [tile, "vectorized"]],
                     "nhwc_to_nchw": [[min(tile, 8), "unrolled"], [min(tile, 8), "vectorized"]],
                     "nchw_with_bias": [[min(tile, 8), "unrolled"], [min(tile, 8), "vectorized"]],
                     "scaled_keys": [[tile, "unrolled"], [tile, "vectorized"]]}, out
    for name in ("queries", "mixed", "wrapping"):
        assert out[name]["tail"][-1] == [2 * tile, "vectorized"], out
    assert {name for name, case in out.items() if case["parallel"]} == {
        "keys", "batched_keys", "nhwc_to_nchw", "nchw_with_bias", "scaled_keys", "queries"}, out


#: Run on the TVM Python: the Matmul rule on batched products whose B is (K, N)
#: and (N, K) (Q K^T, were the transpose fused into the product), and with B
#: shared by the batch: its largest error against numpy; and the tiles it picks
#: for each x86-64 level.
_MATMUL_SHAPES = """
import json, sys
import numpy as np, tvm
from tvm import te
sys.path.insert(0, sys.argv[1])
from cpu_schedule import matmul
rng, target, out = np.random.default_rng(0), tvm.target.Target("llvm"), {}
x, k = te.placeholder((4, 64, 32), name="x"), te.reduce_axis((0, 32), name="k")
products = {"kn": ((4, 32, 64), "bik,bkj->bij", lambda w, b, i, j: w[b, k, j]),
            "nk": ((4, 64, 32), "bik,bjk->bij", lambda w, b, i, j: w[b, j, k]),
            "nk shared": ((64, 32), "bik,jk->bij", lambda w, b, i, j: w[j, k])}
for name, (shape, subscripts, read) in products.items():
    w = te.placeholder(shape, name="w")
    y = te.compute((4, 64, 64), lambda b, i, j: te.sum(x[b, i, k] * read(w, b, i, j), axis=k), name="y")
    sch = matmul.Matmul().apply(te.create_prim_func([x, w, y]), target, False)
    args = [rng.standard_normal(s).astype("float32") for s in ((4, 64, 32), shape)]
    result = tvm.runtime.tensor(np.zeros((4, 64, 64), "float32"))
    tvm.compile(sch.mod, target=target)(*map(tvm.runtime.tensor, args), result)
    out[name] = float(np.abs(result.numpy() - np.einsum(subscripts, *args)).max())
# K = 512: a column tile of B (512 x 16 on SSE) outsizes L1's share, so the
# sum runs in chunks of k; the same values as the plain loop nest's, to the bit.
x, k = te.placeholder((2, 64, 512), name="x"), te.reduce_axis((0, 512), name="k")
w = te.placeholder((512, 128), name="w")
y = te.compute((2, 64, 128), lambda b, i, j: te.sum(x[b, i, k] * w[k, j], axis=k), name="y")
plain = te.create_prim_func([x, w, y])
sch = matmul.Matmul().apply(plain, target, False)
out["chunked loops"] = [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("y_update"))]

def same_as_plain(sch, plain, x, w, y):  # whether the scheduled product's outputs are the plain nest's, bit for bit
    args = [tvm.runtime.tensor(rng.standard_normal([int(n) for n in t.shape]).astype("float32")) for t in (x, w)]
    results = [tvm.runtime.tensor(np.zeros([int(n) for n in y.shape], "float32")) for _ in range(2)]
    for func, result in zip((sch.mod, plain), results):
        tvm.compile(func, target=target)(*args, result)
    return bool(np.array_equal(results[0].numpy(), results[1].numpy()))

out["chunked same"] = same_as_plain(sch, plain, x, w, y)
# 384 columns: AVX-512 tiles of 8 rows by 3 vectors (48 columns), each
# vectorized loop one register wide; the same values as the plain nest's on SSE.
x, k = te.placeholder((1, 64, 128), name="x"), te.reduce_axis((0, 128), name="k")
w = te.placeholder((128, 384), name="w")
y = te.compute((1, 64, 384), lambda b, i, j: te.sum(x[b, i, k] * w[k, j], axis=k), name="y")
plain = te.create_prim_func([x, w, y])
widths = {}
for mcpu in ("x86-64", "x86-64-v4"):
    sch = matmul.Matmul().apply(plain, tvm.target.Target({"kind": "llvm", "mcpu": mcpu}), False)
    widths[mcpu] = sorted({int(sch.get(loop).extent) for block in sch.get_child_blocks(sch.get_sblock("root"))
                           for loop in sch.get_loops(block) if sch.get(loop).kind == tvm.tirx.ForKind.VECTORIZED})
out["vector widths 384"] = widths
out["384 same"] = same_as_plain(matmul.Matmul().apply(plain, target, False), plain, x, w, y)
# Constant weights (layout-free: packed) of 768x768 (2.25 MiB, over a core's L2)
# and 128x512 (256 KiB), with a relu after the product: which of C's axes the
# threads' fused loop starts with, and the values against the plain nest's.
for kdim, ndim in ((768, 768), (128, 512)):
    x, k = te.placeholder((128, kdim), name="x"), te.reduce_axis((0, kdim), name="k")
    w = te.placeholder((kdim, ndim), name="w")
    y = te.compute((128, ndim), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    z = te.compute((128, ndim), lambda i, j: te.max(y[i, j], 0.0), name="z")
    plain = te.create_prim_func([x, w, z]).with_attr("layout_free_buffers", [1])
    for mcpu in ("x86-64", "x86-64-v4"):
        sch = matmul.Matmul().apply(plain, tvm.target.Target({"kind": "llvm", "mcpu": mcpu}), False)
        threaded = [sch.get(loop).loop_var.name for loop in sch.get_loops(sch.get_sblock("y_update"))
                    if sch.get(loop).kind == tvm.tirx.ForKind.PARALLEL]
        out[f"{kdim}x{ndim} {mcpu} threads"] = threaded[0].split("_")[0]
    out[f"{kdim}x{ndim} same"] = same_as_plain(matmul.Matmul().apply(plain, target, False), plain, x, w, z)
out["chunks"] = {f"k{k} {mt}x{nt} of {tiles}, {tasks}": matmul.k_chunk(k, mt, nt, tiles, tasks)
                 for k, mt, nt, tiles, tasks in
                 ((512, 4, 64, 16, 2), (128, 4, 64, 16, 2), (128, 4, 16, 16, 2), (512, 4, 16, 16, 2),
                  (1280, 1, 40, 1, 25), (64, 4, 64, 16, 2), (4096, 8, 10, 4, 1), (512, 4, 64, 8, 1))}
for mcpu in ("x86-64", "x86-64-v3", "x86-64-v4"):
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    shape = (matmul.vector_lanes(target), matmul.accumulator_registers(target), matmul.broadcast_cost(target))
    out[mcpu] = {f"{m}x{n}": matmul.tile_shape(m, n, *shape)
                 for m, n in ((512, 128), (1, 512), (8, 10), (6, 100), (1, 1000))}
print(json.dumps(out))
"""


def test_matmul_tiles_fit_each_levels_registers() -> None:
    out = run_tvm_script(_MATMUL_SHAPES, str(TVM_PACKAGE), timeout=300)
    assert out["kn"] < 1e-4 and out["nk"] < 1e-4 and out["nk shared"] < 1e-4, out
    # (rows, columns): AVX-512 tiles of up to 24 zmm accumulators, SSE and AVX2 12,
    # SSE's wider and shorter (a broadcast is two instructions there); a single
    # row as wide as the registers allow; a row of 10 is one tile wide; 100
    # columns are whole vectors of 4 (25: one at a time), not of 8 or 16, and a
    # classifier's 1000 whole vectors of 8, not of 16: tiles of the narrower.
    assert out["x86-64"] == {"512x128": [2, 16], "1x512": [1, 32], "8x10": [4, 10], "6x100": [6, 4],
                             "1x1000": [1, 40]}, out
    assert out["x86-64-v3"] == {"512x128": [4, 16], "1x512": [1, 64], "8x10": [4, 10], "6x100": [6, 4],
                                "1x1000": [1, 40]}, out
    assert out["x86-64-v4"] == {"512x128": [4, 64], "1x512": [1, 256], "8x10": [8, 10], "6x100": [6, 4],
                                "1x1000": [1, 40]}, out
    # Sums over k in chunks (k steps, row tiles) where a column tile of B is
    # over 16 KiB and several row tiles read it: K = 512 and 128 by 64 columns
    # (AVX-512's 4 x 64 tiles: the transformer block's products; rows of C
    # up to 8 KiB a chunk), 512 by 16 (AVX2's), 4096 by a classifier's 10;
    # not 128 by 16 or 64 by 64 (16 KiB or less), nor a single row tile (a
    # dense layer at batch 1). With no other task (one batch, one column
    # tile), a chunk takes half the rows at most: two tasks for two threads.
    assert out["chunks"] == {"k512 4x64 of 16, 2": [64, 8], "k128 4x64 of 16, 2": [64, 8],
                             "k128 4x16 of 16, 2": None, "k512 4x16 of 16, 2": [256, 16],
                             "k1280 1x40 of 1, 25": None, "k64 4x64 of 16, 2": None,
                             "k4096 8x10 of 4, 1": [256, 2], "k512 4x64 of 8, 1": [64, 4]}, out
    # The chunked product on SSE (2 x 16 tiles, chunks of 256 k): the batch,
    # row chunks and column tiles fused on TVM's threads (2 x 1 x 8), then the
    # chunks of k, the chunk's 32 row tiles, k within the chunk, the tile's 2
    # rows by 4 vectors of 4.
    assert out["chunked loops"] == [16, 2, 32, 256, 2, 4, 4], out
    assert out["chunked same"], out
    # A tile of 3 vectors (384 columns on AVX-512) is 3 vectors of 16 lanes, not
    # one of 48, which LLVM has no register for (64x128 by 128x384: 2 ms
    # instead of 50 µs); SSE's tiles of 16 columns are 4 vectors of 4.
    assert out["vector widths 384"] == {"x86-64": [4], "x86-64-v4": [16]}, out
    assert out["384 same"], out
    # A packed weight over a core's L2 (768x768): each thread takes whole
    # column tiles (j), reading its part of B once; a smaller one (128x512):
    # each thread whole rows (i), which the next kernel reads from its own L2.
    assert {key: v for key, v in out.items() if key.endswith("threads")} == {
        "768x768 x86-64 threads": "j", "768x768 x86-64-v4 threads": "j",
        "128x512 x86-64 threads": "i", "128x512 x86-64-v4 threads": "i"}, out
    assert out["768x768 same"] and out["128x512 same"], out


#: Run on the TVM Python: a dense layer at batch 1 (256 -> 1000, a
#: classifier's width) whose weight is a constant, and one whose weight is an
#: input, through compile_model's CPU pipeline for the target in argv[2]
#: (1000 is whole vectors of 4 and 8, not of 16): the ranks of the product's
#: parameters (3 for a weight packed at compile time) and the largest error
#: against numpy, relative to the largest.
_DENSE_WEIGHTS = """
import json, sys
import numpy as np, tvm
from tvm import relax
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import compile_model
target = tvm.target.Target(json.loads(sys.argv[2]))
rng, out = np.random.default_rng(0), {}
x, w = (rng.standard_normal(shape).astype("float32") for shape in ((1, 256), (256, 1000)))
for weights in ("constant", "input"):
    xv = relax.Var("x", relax.TensorType((1, 256), "float32"))
    wv = relax.Var("w", relax.TensorType((256, 1000), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv] if weights == "constant" else [xv, wv]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.matmul(xv, relax.const(w) if weights == "constant" else wv)))
        bb.emit_func_output(y)
    lowered = compile_model.cpu_pipeline(target)(bb.get())
    ranks = [[len(p.shape) for p in f.params] for g, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in g.name_hint]
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target=target, relax_pipeline=compile_model.cpu_pipeline(target)),
                              tvm.cpu())
    got = vm["main"](*map(tvm.runtime.tensor, [x] if weights == "constant" else [x, w])).numpy()
    out[weights] = {"ranks": ranks, "error": float(np.abs(got - x @ w).max() / np.abs(x @ w).max())}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", TARGETS)
def test_dense_weights_that_are_constants_are_packed_at_compile_time(target: dict[str, str]) -> None:
    """A constant dense weight is repacked once, when the library is compiled,
    so that each column tile reads its weights as one stream: the product
    takes it as a 3-D constant ([N / tile][K][tile]). A weight that is an input
    is read in place (2-D). The values are numpy's either way."""
    out = run_tvm_script(_DENSE_WEIGHTS, str(TVM_PACKAGE.parent), json.dumps(target), timeout=300)
    # (A, B, C) of the product; a constant's repacking, (B, packed B), is a
    # function of its own that FoldConstant ran.
    assert [2, 3, 2] in out["constant"]["ranks"] and out["input"]["ranks"] == [[2, 2, 2]], out
    assert out["constant"]["error"] < 1e-5 and out["input"]["error"] < 1e-5, out


#: Run on the TVM Python: a dense layer of 64 rows, 128 -> 512, with a bias
#: epilogue and with exact GELU's, through compile_model's CPU pipeline for the
#: target in argv[2]: whether the product's kernel calls
#: TVMBackendAllocWorkspace, and (where argv[3] says this CPU runs the target)
#: the largest error against numpy, relative to the largest.
_EPILOGUE_TILES = """
import json, math, sys
import numpy as np, tvm
from tvm import relax
sys.path.insert(0, sys.argv[1])
from tf_op_tvm import compile_model
compile_model.math_lowering.register()
target = tvm.target.Target(json.loads(sys.argv[2]))
rng, out = np.random.default_rng(0), {}
x, w, b = (rng.standard_normal(shape).astype("float32") for shape in ((64, 128), (128, 512), (512,)))
erf = np.vectorize(math.erf)
wants = {"bias": x @ w + b, "gelu": (x @ w) * (0.5 + erf((x @ w).astype("float64") / math.sqrt(2)) * 0.5)}
for epilogue, want in wants.items():
    xv = relax.Var("x", relax.TensorType((64, 128), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(xv, relax.const(w)))
            if epilogue == "bias":
                y = bb.emit(relax.op.add(y, relax.const(b)))
            else:
                e = bb.emit(relax.op.erf(bb.emit(relax.op.multiply(y, relax.const(0.70710678, "float32")))))
                y = bb.emit(relax.op.multiply(y, bb.emit(relax.op.add(relax.const(0.5, "float32"),
                                                                         relax.op.multiply(e, relax.const(0.5, "float32"))))))
            y = bb.emit_output(y)
        bb.emit_func_output(y)
    lowered = compile_model.cpu_pipeline(target)(bb.get())
    products = [(g.name_hint, f) for g, f in lowered.functions.items()
                if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in g.name_hint and not g.name_hint.endswith("weight_prepack")]
    workspace = [allocates_workspace(f, name, target) for name, f in products]
    error = None
    if sys.argv[3] == "runs":
        vm = relax.VirtualMachine(tvm.compile(bb.get(), target=target, relax_pipeline=compile_model.cpu_pipeline(target)),
                                  tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        error = float(np.abs(got - want).max() / np.abs(want).max())
    out[epilogue] = {"workspace": workspace, "error": error}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", [{"kind": "llvm", "mcpu": m} for m in ("x86-64", "x86-64-v3")],
                         ids=["x86-64", "x86-64-v3"])
def test_product_tiles_with_an_epilogue_stay_off_the_workspace_allocator(target: dict[str, str]) -> None:
    """A product with an epilogue (a bias, exact GELU) sums each register tile
    in a buffer under 1 KiB that TVM puts on the stack (and LLVM in registers),
    not one it allocates and frees with calls of TVMBackendAllocWorkspace for
    every tile (AVX2's transformer block at batch 8 1.10x as fast so); the
    values are numpy's. Compiled for SSE and AVX2 (tiles of 1 KiB, AVX-512's
    4 x 64, still take the calls), run where this CPU can."""
    runs = target["mcpu"] == "x86-64" or {"avx2", "fma"} <= _HOST_FLAGS
    out = run_tvm_script(_EPILOGUE_TILES, str(TVM_PACKAGE.parent), json.dumps(target), "runs" if runs else "compiles",
                         timeout=300)
    assert {name: cell["workspace"] for name, cell in out.items()} == {"bias": [False], "gelu": [False]}, out
    assert all(cell["error"] is None or cell["error"] < 1e-5 for cell in out.values()), out


#: Run on the TVM Python: softmax and a mean over rows of 64 (whole vectors
#: on every level), scheduled by the row-reduction rule: each reduction's
#: block along the row (rfactor's) and whether its innermost loop is a vector,
#: and the largest error against numpy, relative to the largest value.
_ROW_REDUCTIONS = """
import json, sys
import numpy as np, tvm
from tvm import te, tirx, topi
sys.path.insert(0, sys.argv[1])
from cpu_schedule import reduction
x = te.placeholder((48, 64), name="x")
rng, out = np.random.default_rng(0), {}
data = rng.standard_normal((48, 64)).astype("float32") * 4
total = topi.sum(x, axis=1, keepdims=True)
mean = te.compute(total.shape, lambda i, j: total[i, j] / 64.0, name="mean")
for name, op, want in (("softmax", topi.nn.softmax(x), np.exp(data) / np.exp(data).sum(1, keepdims=True)),
                       ("mean", mean, data.mean(1, keepdims=True))):
    for mcpu in ("x86-64", "x86-64-v3", "x86-64-v4"):
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
        sch = reduction.RowReduction().apply(te.create_prim_func([x, op]), target, False)
        in_vectors = {}
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            if sch.get(block).name_hint.endswith("_rf_update"):
                in_vectors[sch.get(block).name_hint] = sch.get(sch.get_loops(block)[-1]).kind == tirx.ForKind.VECTORIZED
        got, error = tvm.runtime.tensor(np.zeros(want.shape, "float32")), None
        if mcpu != "x86-64-v4" or "avx512f" in sys.argv[2]:
            tvm.compile(sch.mod, target=target)(tvm.runtime.tensor(data), got)
            error = float(np.abs(got.numpy() - want).max() / np.abs(want).max())
        out[f"{name} {mcpu}"] = {"in_vectors": in_vectors, "error": error}
print(json.dumps(out))
"""


def test_row_reductions_sum_and_take_maxima_in_vectors() -> None:
    """Softmax's max and sum and a mean's sum run along the row in vectors,
    on every level, within float32 rounding of numpy."""
    out = run_tvm_script(_ROW_REDUCTIONS, str(TVM_PACKAGE), " ".join(sorted(_HOST_FLAGS)), timeout=300)
    for mcpu in ("x86-64", "x86-64-v3", "x86-64-v4"):
        softmax, mean = out[f"softmax {mcpu}"], out[f"mean {mcpu}"]
        assert softmax["in_vectors"] == {"T_softmax_maxelem_rf_update": True, "T_softmax_expsum_rf_update": True}, out
        assert list(mean["in_vectors"].values()) == [True], out
    # The AVX-512 library runs only where the CPU has AVX-512 (error None elsewhere).
    assert all(v["error"] < 1e-6 for v in out.values() if v["error"] is not None), out


#: Run on the TVM Python: softmax over rows of several sizes, scheduled by the
#: row-reduction rule: whether it ran the rows on TVM's threads (or refused:
#: null), and the largest error against numpy, relative to the largest value.
_PARALLEL_ROWS = """
import json, sys
import numpy as np, tvm
from tvm import te, tirx, topi
sys.path.insert(0, sys.argv[1])
from cpu_schedule import reduction
target, out = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64"}), {}
for rows, length in ((48, 64), (1024, 64), (256, 256), (2048, 256)):
    x = te.placeholder((rows, length), name="x")
    sch = reduction.RowReduction().apply(te.create_prim_func([x, topi.nn.softmax(x)]), target, False)
    if sch is None:
        out[f"{rows}x{length}"] = None
        continue
    data = np.random.default_rng(0).standard_normal((rows, length)).astype("float32") * 4
    want = np.exp(data) / np.exp(data).sum(1, keepdims=True)
    got = tvm.runtime.tensor(np.zeros(want.shape, "float32"))
    tvm.compile(sch.mod, target=target)(tvm.runtime.tensor(data), got)
    loops = [sch.get(loop) for block in sch.get_child_blocks(sch.get_sblock("root")) for loop in sch.get_loops(block)]
    out[f"{rows}x{length}"] = {"parallel": any(loop.kind == tirx.ForKind.PARALLEL for loop in loops),
                               "error": float(np.abs(got.numpy() - want).max() / np.abs(want).max())}
print(json.dumps(out))
"""


def test_row_reductions_with_work_for_two_threads_run_on_them() -> None:
    """Softmax of 64K elements or more runs its rows on TVM's threads, where a
    few rows' exponentials fit on a task's stack (rows of 64); rows of 256
    (1 KiB) do not, and run on one thread, or, with work enough for the
    fallback's threads (512K), are the fallback's. Values within float32
    rounding of numpy's."""
    out = run_tvm_script(_PARALLEL_ROWS, str(TVM_PACKAGE), timeout=300)
    assert {shape: cell and cell["parallel"] for shape, cell in out.items()} == {
        "48x64": False, "1024x64": True, "256x256": False, "2048x256": None}, out
    assert all(cell["error"] < 1e-6 for cell in out.values() if cell), out


#: What the math lowering scripts share: ``fn`` of each of ``values`` compiled for
#: the target of argv[2], in vectors of ``lanes``; the results and the LLVM IR.
_RUN_ELEMENTWISE = """
def run(fn, values, lanes):
    x = te.placeholder(values.shape, str(values.dtype), name="x")
    sch = s_tir.Schedule(te.create_prim_func([x, te.compute(values.shape, lambda i: fn(x[i]), name="y")]))
    if lanes > 1:
        sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])[1])
    f = tvm.compile(sch.mod, target=json.loads(sys.argv[2]))
    y = tvm.runtime.tensor(np.zeros_like(values))
    f(tvm.runtime.tensor(values), y)
    return y.numpy(), f.mod.inspect_source("ll")
"""


#: Run on the TVM Python: float32 erf through the worker's lowering, scalar and
#: in vectors, against math.erf in float64 (in ulps of the float32 result);
#: float64 keeps libm's erf.
_ERF = """
import json, math, sys
import numpy as np, tvm
from tvm import s_tir, te, tirx
sys.path.insert(0, sys.argv[1])
import math_lowering
math_lowering.register()
""" + _RUN_ELEMENTWISE + """
rng = np.random.default_rng(0)
specials = [0.0, -0.0, np.inf, -np.inf, np.nan]
xs = np.concatenate([specials, [4.0, -4.0, 3.99, 1e-30], rng.uniform(-6, 6, 1 << 16),
                     rng.uniform(-1e-3, 1e-3, 1 << 12)])
out = {}
for dtype, lanes in (("float32", 1), ("float32", 8), ("float64", 1)):
    values = np.concatenate([xs, np.zeros(-len(xs) % lanes)]).astype(dtype)
    y, ll = run(tirx.erf, values, lanes)
    got = y.astype(np.float64)
    want = np.array([math.erf(v) if not math.isnan(v) else v for v in values.astype(np.float64)])
    finite = np.isfinite(values) & (want != 0)
    ulps = np.abs(got - want)[finite] / np.spacing(np.abs(want[finite]).astype(dtype)).astype(np.float64)
    out[f"{dtype}x{lanes}"] = {"ulp": float(ulps.max()), "absolute": float(np.abs(got - want)[finite].max()),
                               "special": [repr(float(v)) for v in got[:len(specials)]],
                               "libm": "@erf" in ll}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", TARGETS[:2])
def test_erf_lowers_to_a_rational_function_within_8_ulps(target: dict[str, str]) -> None:
    """Exact GELU's erf: no libm call left for float32 (scalar or vector), within
    8 ulps and 5e-7 of the exact value, with or without FMA; ±0, ±1 at ±inf,
    NaN kept; float64 keeps libm's erf."""
    out = run_tvm_script(_ERF, str(TVM_PACKAGE), json.dumps(target), timeout=300)
    for case in ("float32x1", "float32x8"):
        assert out[case]["ulp"] <= 8 and out[case]["absolute"] < 5e-7 and not out[case]["libm"], out
        assert out[case]["special"] == ["0.0", "-0.0", "1.0", "-1.0", "nan"], out
    assert out["float64x1"]["special"] == ["0.0", "-0.0", "1.0", "-1.0", "nan"], out
    assert out["float64x1"]["libm"] and out["float64x1"]["ulp"] <= 4, out


#: Run on the TVM Python: float32 sigmoid through the worker's lowering, scalar
#: and in vectors, against numpy in float64 (in ulps of the float32 result, and
#: in subnormal steps where the result is subnormal); float64 keeps TVM's.
_SIGMOID = """
import json, sys
import numpy as np, tvm
from tvm import s_tir, te, tirx
sys.path.insert(0, sys.argv[1])
import math_lowering
math_lowering.register()
""" + _RUN_ELEMENTWISE + """
np.seterr(all="ignore")  # the reference's exp overflows on purpose
rng = np.random.default_rng(0)
specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e30, 1e30, -104.5]
xs = np.concatenate([specials, [16.63, 16.64, -87.4, -103.0, -104.0], rng.uniform(-110, 30, 1 << 20),
                     rng.uniform(-5, 5, 1 << 16)])
out = {}
for dtype, lanes in (("float32", 1), ("float32", 16), ("float64", 1)):
    values = np.concatenate([xs, np.zeros(-len(xs) % lanes)]).astype(dtype)
    got, ll = run(tirx.sigmoid, values, lanes)
    want = (1 / (1 + np.exp(-values.astype(np.float64)))).astype(dtype)
    normal = np.isfinite(want) & (want >= np.finfo(dtype).tiny)
    error = np.abs(got.astype(np.float64) - want)
    out[f"{dtype}x{lanes}"] = {
        "ulp": float((error[normal] / np.spacing(want[normal])).max()),
        "subnormal_steps": float((error[~normal & (want > 0)] / np.finfo(dtype).smallest_subnormal).max(initial=0)),
        "special": [repr(float(v)) for v in got[:len(specials)]],
        "exp": "llvm.exp." in ll}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", TARGETS[:2])
def test_sigmoid_lowers_to_tfs_own_within_8_ulps(target: dict[str, str]) -> None:
    """Swish's and the gates' sigmoid: float32 as TF computes it (Eigen's
    logistic, e^(x/2) squared), scalar or vector: no exp call left, within 8
    ulps of the exact value (subnormal results: 2 steps), 1 at +inf and
    above 16.64, 0 below -104, ±0 give 0.5, NaN kept. float64 keeps TVM's
    1 / (1 + exp(-x))."""
    out = run_tvm_script(_SIGMOID, str(TVM_PACKAGE), json.dumps(target), timeout=300)
    for case in ("float32x1", "float32x16"):
        assert out[case]["ulp"] <= 8 and out[case]["subnormal_steps"] <= 2 and not out[case]["exp"], out
        assert out[case]["special"] == ["0.5", "0.5", "1.0", "0.0", "nan", "0.0", "1.0", "0.0"], out
    assert out["float64x1"]["exp"] and out["float64x1"]["ulp"] <= 4, out


#: Run on the TVM Python: float32 tanh through the worker's lowering, scalar
#: and in vectors, against numpy in float64 (in ulps of the float32 result);
#: float64 keeps TVM's.
_TANH = """
import json, sys
import numpy as np, tvm
from tvm import s_tir, te, tirx
sys.path.insert(0, sys.argv[1])
import math_lowering
math_lowering.register()
""" + _RUN_ELEMENTWISE + """
rng = np.random.default_rng(0)
specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 7.91, -7.91, 1e-30, -1e-40]
xs = np.concatenate([specials, rng.uniform(-12, 12, 1 << 20), rng.uniform(-1e-3, 1e-3, 1 << 16)])
out = {}
for dtype, lanes in (("float32", 1), ("float32", 16), ("float64", 1)):
    values = np.concatenate([xs, np.zeros(-len(xs) % lanes)]).astype(dtype)
    got, ll = run(tirx.tanh, values, lanes)
    want = np.tanh(values.astype(np.float64)).astype(dtype)
    finite = np.isfinite(want) & (want != 0)
    out[f"{dtype}x{lanes}"] = {
        "ulp": float((np.abs(got.astype(np.float64) - want)[finite] / np.spacing(np.abs(want[finite]))).max()),
        "special": [repr(float(v)) for v in got[:len(specials) - 2]],
        "tiny_kept": bool((got[len(specials) - 2:len(specials)] == values[len(specials) - 2:len(specials)]).all()),
        "exp": "llvm.exp." in ll}
print(json.dumps(out))
"""


@pytest.mark.parametrize("target", TARGETS[:2])
def test_tanh_lowers_to_tfs_own_within_8_ulps(target: dict[str, str]) -> None:
    """The LSTM's and approximate GELU's tanh: float32 as TF computes it (Eigen's
    [9/8] rational function), scalar or vector: no exp left, within 8 ulps of
    the exact value, ±1 from ±7.91 and at ±inf, ±0 and tiny values kept, NaN
    kept. float64 keeps TVM's two exps (which lose tiny values to cancellation)."""
    out = run_tvm_script(_TANH, str(TVM_PACKAGE), json.dumps(target), timeout=300)
    for case in ("float32x1", "float32x16"):
        assert out[case]["ulp"] <= 8 and not out[case]["exp"], out
        assert out[case]["special"] == ["0.0", "-0.0", "1.0", "-1.0", "nan", "1.0", "-1.0"], out
        assert out[case]["tiny_kept"], out
    assert out["float64x1"]["exp"], out


def _expansion(kernel: int, stride: int) -> keras.Model:
    """MobileNetV2's block head: a 1x1 expansion (16 to 96 channels, relu6),
    then a depthwise convolution (relu6). The wide tensor, 64x64x96, is 1.5 MiB:
    more than a core's L2 here."""
    keras.utils.set_random_seed(5)
    x = keras.Input((64, 64, 16))
    h = keras.layers.ReLU(6.0)(keras.layers.Conv2D(96, 1)(x))
    h = keras.layers.DepthwiseConv2D(kernel, strides=stride, padding="same")(h)
    return keras.Model(x, keras.layers.ReLU(6.0)(h))


#: Run on the TVM Python: a TFLite model compiled by compile_model's pipeline
#: for a target: the loop nests that hold both convolutions; with "compare",
#: whether its outputs are those of the pipeline without expansion_fusion, to
#: the bit.
_EXPANSIONS = """
import json, sys
from pathlib import Path
import numpy as np
import tvm
from tvm import relax, tirx
sys.path.insert(0, sys.argv[1])
import compile_model, expansion_fusion, math_lowering
target = tvm.target.Target(json.loads(sys.argv[3]))
math_lowering.register()
model = compile_model.import_tflite(Path(sys.argv[2]).read_bytes())
x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 64, 64, 16)).astype("float32"))
outputs, merged = [], []
for fused in (True, False)[:2 if sys.argv[4:] == ["compare"] else 1]:
    if not fused:  # the pass as a step that changes nothing
        expansion_fusion.fuse_expansions = lambda target, rule, report: tvm.transform.Sequential([])
    with tvm.transform.PassContext(opt_level=3), target:
        lowered = compile_model.cpu_pipeline(target)(model)
    if fused:
        for gvar, func in lowered.functions.items():
            if isinstance(func, tirx.PrimFunc):
                text = func.script()
                if 'sblock("conv2d_nhwc' in text and 'sblock("group_conv2d_nhwc' in text:
                    merged.append(gvar.name_hint)
    if sys.argv[4:] == ["compare"]:
        executable = compile_model.compile_relax(model, target, compile_model.cpu_pipeline(target))
        outputs.append(relax.VirtualMachine(executable, tvm.cpu())["main"](x).numpy())
print(json.dumps({"merged": merged, "same": len(outputs) == 2 and bool(np.array_equal(*outputs))}))
"""


@pytest.mark.parametrize("target", TARGETS)
def test_an_expansion_and_the_stride_2_depthwise_convolution_after_it_are_one_loop_nest(
        target: dict[str, str], tmp_path: Path) -> None:
    """The 1x1 convolution and the 3x3 stride-2 depthwise one that reads it
    are one loop nest (bands of output rows, each band's wide rows kept in
    L2), with the outputs of the two apart to the bit; a stride-1 depthwise
    convolution, whose bands would recompute a quarter of the wide rows, and
    a 5x5 stride-2 one stay apart."""
    found = {}
    for kernel, stride in ((3, 2), (3, 1), (5, 2)):
        concrete = tf.function(lambda t, m=_expansion(kernel, stride): m(t)).get_concrete_function(
            tf.TensorSpec((1, 64, 64, 16), tf.float32))
        path = tmp_path / f"expansion_{kernel}_{stride}.tflite"
        path.write_bytes(to_tflite(concrete, "expansion"))
        compare = ["compare"] if (kernel, stride) == (3, 2) else []
        found[kernel, stride] = run_tvm_script(_EXPANSIONS, str(TVM_PACKAGE), str(path), json.dumps(target),
                                               *compare, timeout=300)
    assert len(found[3, 2]["merged"]) == 1 and found[3, 2]["same"], found
    assert found[3, 1]["merged"] == [] and found[5, 2]["merged"] == [], found


def test_a_compiled_expansion_and_depthwise_convolution_match_keras(tmp_path: Path) -> None:
    """The same block through tf_op.compile (every x86-64 level built, the
    host's run), against Keras; two images, whose bands share TVM's threads."""
    model, x = _expansion(3, 2), _inputs(2, 64, 64, 16)
    y = compile(model, cache_dir=tmp_path, batch_sizes=[2])(x)
    _assert_close(y.numpy(), model(x).numpy())
