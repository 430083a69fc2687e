"""Full op semantics: several outputs, dynamic shapes, every dtype, device,
alignment and zero copy, threads, and graphs written for the old TvmDsoOp."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import tf_op
from tf_op import _library
from helpers import TVM_DTYPES, buffer_address, legacy_graph, run_in_threads, run_python


@pytest.fixture(scope="module")
def mod(testlib: str) -> tf_op.Module:
    return tf_op.Module(testlib)


@pytest.fixture(scope="module")
def ffi(ffilib: str) -> tf_op.Module:
    return tf_op.Module(ffilib)



# --- several outputs -------------------------------------------------------------


def test_several_outputs_of_different_dtypes_and_shapes(mod: tf_op.Module) -> None:
    fn = mod.func("two_outputs", output_shapes=[None, [2]], output_dtypes=[None, "float64"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    doubled, sums = fn(tf.constant(x))
    assert doubled.dtype == tf.float32 and sums.dtype == tf.float64
    np.testing.assert_array_equal(doubled.numpy(), x * 2)
    np.testing.assert_array_equal(sums.numpy(), x.sum(axis=1))


def test_several_outputs_in_tf_function(mod: tf_op.Module) -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        fn = mod.func("two_outputs", output_shapes=[None, [tf.shape(x)[0]]], output_dtypes=[tf.float32, tf.float64])
        doubled, sums = fn(x)
        assert doubled.shape.rank == 2 and sums.shape.as_list() == [None]
        return doubled, sums

    x = np.ones((4, 5), np.float32)
    doubled, sums = f(tf.constant(x))
    np.testing.assert_array_equal(doubled.numpy(), x * 2)
    np.testing.assert_array_equal(sums.numpy(), [5.0] * 4)


def test_single_entry_output_lists_return_a_tuple(mod: tf_op.Module) -> None:
    (y,) = mod.func("add_one", output_dtypes=["float32"])(tf.constant([1.0]))
    np.testing.assert_array_equal(y.numpy(), [2.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"output_shapes": [None, None], "output_dtypes": ["float32"]},
        {"output_shapes": [], "output_dtypes": []},
        {"output_shape": [2], "output_shapes": [[2]]},
    ],
)
def test_inconsistent_output_lists(mod: tf_op.Module, kwargs: dict) -> None:
    with pytest.raises(ValueError, match="two_outputs"):
        mod.func("two_outputs", **kwargs)


# --- output shapes ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_shape_as_1d_tensor(mod: tf_op.Module, dtype: tf.DType) -> None:
    fn = mod.func("transpose", output_shape=tf.constant([3, 2], dtype))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(fn(tf.constant(x)).numpy(), x.T)


def test_shape_mixing_ints_and_scalar_tensors(mod: tf_op.Module) -> None:
    fn = mod.func("transpose", output_shape=[tf.constant(3), 2])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(fn(tf.constant(x)).numpy(), x.T)


def test_shape_tensors_are_read_at_every_call(mod: tf_op.Module) -> None:
    rows = tf.Variable(2, dtype=tf.int64)
    fn = mod.func("row_sum", output_shape=[rows])

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x: tf.Tensor) -> tf.Tensor:
        return fn(x)

    np.testing.assert_array_equal(f(tf.ones([2, 3])).numpy(), [3.0, 3.0])
    rows.assign(4)
    np.testing.assert_array_equal(f(tf.ones([4, 2])).numpy(), [2.0] * 4)
    np.testing.assert_array_equal(fn(tf.ones([4, 1])).numpy(), [1.0] * 4)


def test_shape_function_static_and_dynamic(mod: tf_op.Module) -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x: tf.Tensor) -> tf.Tensor:
        static = mod.func("transpose", output_shape=[3, 2])(x)
        constant = mod.func("transpose", output_shape=tf.constant([3, 2]))(x)
        dynamic = mod.func("transpose", output_shape=[tf.shape(x)[1], tf.shape(x)[0]])(x)
        # A size the graph knows is known after one it does not (each is its own input).
        mixed = mod.func("transpose", output_shape=[tf.shape(x)[1], tf.constant(2)])(x)
        assert static.shape.as_list() == [3, 2]
        assert constant.shape.as_list() == [3, 2]
        assert dynamic.shape.as_list() == [None, None]
        assert mixed.shape.as_list() == [None, 2]
        return dynamic

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(f(tf.constant(x)).numpy(), x.T)


def _tvmdso_nodes(graph_def: tf.compat.v1.GraphDef) -> list:
    return [n for n in graph_def.node if n.op == "TVMDSOOp"]


def test_static_shapes_give_the_op_no_output_dims_input(mod: tf_op.Module) -> None:
    """A node input TF must deliver on every run costs the executor more than the
    kernel's whole call into TVM (docs/design.md, "Rules that keep it fast"): static shapes add none, and
    scalar sizes go in as they are, with no Concat or Reshape node to run."""

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    def f(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        static = mod.func("transpose", output_shape=[3, 2])(x)
        dynamic = mod.func("transpose", output_shape=[tf.shape(x)[1], 2])(x)
        return static, dynamic

    static, dynamic = _tvmdso_nodes(f.get_concrete_function().graph.as_graph_def())
    assert static.attr["output_dims_parts"].i == 0
    assert len(static.input) == 2  # x, library
    assert dynamic.attr["output_dims_parts"].i == 1
    assert len(dynamic.input) == 3  # x, the scalar size, library
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for got in f(tf.constant(x)):
        np.testing.assert_array_equal(got.numpy(), x.T)


@pytest.mark.parametrize(("values", "output_shape"), [([3, 2], [None, None]), ([3], [None, 2])])
def test_graphs_with_one_output_dims_vector_still_run(testlib: str, values: list[int], output_shape: list) -> None:
    """Graphs and SavedModels written before output_dims_parts give every node one
    vector of sizes, and no attr: TF fills in the default, one part."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        _library.load().tvmdso_op(
            args=[x], output_dims=[tf.constant(values, tf.int64)], library=testlib, Tout=[tf.float32],
            output_shapes=[output_shape], func_name="transpose", name="tvm",
        )
        graph_def = tf.compat.v1.get_default_graph().as_graph_def()
    (node,) = _tvmdso_nodes(graph_def)
    del node.attr["output_dims_parts"]  # as the op wrote it before the attr existed
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        assert g.get_operation_by_name("tvm").get_attr("output_dims_parts") == 1
        with tf.compat.v1.Session(graph=g) as sess:
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            np.testing.assert_array_equal(sess.run("tvm:0", feed_dict={"x:0": x}), x.T)


def test_saved_models_with_one_output_dims_vector_still_load(mod: tf_op.Module, tmp_path: Path) -> None:
    """The same for a TF2 SavedModel. Saving strips attrs at their default, so a
    node with one vector part is stored exactly as before the attr existed: the
    loader must fill the default in."""
    from tensorflow.core.protobuf import saved_model_pb2

    holder = tf.Module()
    transpose = mod.func("transpose", output_shape=tf.constant([3, 2], tf.int64))  # one vector part
    holder.f = tf.function(transpose, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    tf.saved_model.save(holder, str(tmp_path))
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((tmp_path / "saved_model.pb").read_bytes())
    nodes = [n for f in proto.meta_graphs[0].graph_def.library.function for n in f.node_def if n.op == "TVMDSOOp"]
    assert nodes and all(len(n.input) == 3 and "output_dims_parts" not in n.attr for n in nodes)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(tf.saved_model.load(str(tmp_path)).f(tf.constant(x)).numpy(), x.T)


def test_output_dims_parts_must_be_scalars_or_vectors(testlib: str) -> None:
    matrix = tf.Variable([[3, 2]], dtype=tf.int64, shape=tf.TensorShape(None))  # rank unknown to the graph
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"transpose.*output_dims 0 must be a scalar or a vector"):
        _library.load().tvmdso_op(
            args=[tf.ones([2, 3])], output_dims=[matrix.read_value()], library=testlib, Tout=[tf.float32],
            output_shapes=[[None, None]], func_name="transpose",
        )


def test_negative_shape_tensor_is_op_error(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"transpose.*dimension 0 is -3"):
        mod.func("transpose", output_shape=tf.constant([-3, 2]))(tf.ones([2, 3]))


@pytest.mark.parametrize(
    "shape",
    [tf.constant([[3, 2]]), tf.constant([3.0, 2.0]), [tf.constant([3]), 2], "32", 5, tf.TensorShape([None, 2]), [2**64, 1]],
)
def test_malformed_shapes(mod: tf_op.Module, shape: object) -> None:
    with pytest.raises(ValueError, match="transpose.*shape"):
        mod.func("transpose", output_shape=shape)(tf.ones([2, 3]))


def test_module_arguments_are_checked(testlib: str) -> None:
    """A wrong argument type names the argument, instead of failing later in a strange place."""
    with pytest.raises(TypeError, match="sha256"):
        tf_op.Module(testlib, sha256=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lib_path"):
        tf_op.Module(42)  # type: ignore[arg-type]
    # A bytes path is a path.
    add_one = tf_op.Module(os.fsencode(testlib)).func("add_one")
    np.testing.assert_array_equal(add_one(tf.constant([1.0])).numpy(), [2.0])


# --- dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", TVM_DTYPES)
def test_every_tvm_dtype(mod: tf_op.Module, dtype: str) -> None:
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    if dtype == "bool":
        x = np.array([True, False, True])
        expected = ~x
    else:
        x = np.array([0, 1, 5, 100], dtype=np_dtype)
        expected = (x.astype(np.float64) + 1).astype(np_dtype)
    y = mod.func(f"inc_{dtype}")(tf.constant(x, dtype=tf.as_dtype(dtype)))
    assert y.dtype == tf.as_dtype(dtype)
    np.testing.assert_array_equal(y.numpy(), expected)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_through_tvm_ffi_module(ffi: tf_op.Module, dtype: str) -> None:
    x = np.array([1 + 2j, -3.5 - 0.5j, 0j], dtype=dtype)
    y = ffi.func(f"conj_{dtype}")(tf.constant(x))
    assert y.dtype == tf.as_dtype(dtype)
    np.testing.assert_array_equal(y.numpy(), np.conj(x))


def test_dtype_dlpack_cannot_describe(mod: tf_op.Module) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has dtype string"):
        mod.func("add_one", output_dtype="float32", output_shape=[1])(tf.constant(["a"]))


# --- device ----------------------------------------------------------------------


def test_device_pins_the_op(mod: tf_op.Module) -> None:
    fn = mod.func("add_one", device="/CPU:0")

    @tf.function
    def f(x: tf.Tensor) -> tf.Tensor:
        return fn(x)

    graph = f.get_concrete_function(tf.TensorSpec([None], tf.float32)).graph
    (op,) = [o for o in graph.get_operations() if o.type == "TVMDSOOp"]
    assert "CPU:0" in op.device
    np.testing.assert_array_equal(f(tf.constant([1.0])).numpy(), [2.0])


def test_device_none_follows_tf_placement(mod: tf_op.Module) -> None:
    @tf.function
    def f(x: tf.Tensor) -> tf.Tensor:
        with tf.device("/CPU:0"):
            return mod.func("add_one")(x)

    graph = f.get_concrete_function(tf.TensorSpec([None], tf.float32)).graph
    (op,) = [o for o in graph.get_operations() if o.type == "TVMDSOOp"]
    assert "CPU:0" in op.device


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="needs a machine with no GPU visible to TF")
def test_missing_device_falls_back_with_soft_placement(mod: tf_op.Module) -> None:
    # No GPU here: TF's soft placement (on by default) runs the op on the CPU.
    y = mod.func("add_one", device="/GPU:0")(tf.constant([1.0]))
    np.testing.assert_array_equal(y.numpy(), [2.0])
    assert "CPU" in y.device


# --- alignment and zero copy -----------------------------------------------------


def test_aligned_buffers_are_not_copied(ffi: tf_op.Module) -> None:
    x = tf.constant(np.arange(64, dtype=np.float32))
    assert buffer_address(x) % 64 == 0
    probe = ffi.func("pointer_probe", output_shape=[2], output_dtype="int64")
    out = probe(x)
    seen_input, seen_output = out.numpy().tolist()
    assert seen_input == buffer_address(x), "the input was copied"
    assert seen_output == buffer_address(out), "the output was copied"


def test_misaligned_buffers_go_through_aligned_scratch(ffi: tf_op.Module, mod: tf_op.Module) -> None:
    alignment = 4096  # above TF's 64: forces scratch for input and output
    x = tf.constant(np.arange(64, dtype=np.float32))
    probe = ffi.func("pointer_probe", output_shape=[2], output_dtype="int64", alignment=alignment)
    out = probe(x)
    seen_input, seen_output = out.numpy().tolist()
    assert seen_input % alignment == 0 and seen_output % alignment == 0
    if buffer_address(x) % alignment:
        assert seen_input != buffer_address(x)
    # Values survive the copies in and out.
    a = np.arange(1000, dtype=np.float32)
    y = mod.func("vector_add", alignment=alignment)(tf.constant(a), tf.constant(a))
    np.testing.assert_array_equal(y.numpy(), 2 * a)


def test_slices_give_right_values(mod: tf_op.Module) -> None:
    x = tf.constant(np.arange(17, dtype=np.float32))
    np.testing.assert_array_equal(mod.func("add_one")(x[1:]).numpy(), np.arange(1, 17) + 1)


# --- in-place outputs (inplace={output: input}) -------------------------------------


def _noting(ffi: tf_op.Module, **options: object) -> tf_op.Func:
    """y = x + 1 written over x where TF allows, and where = [x's address, y's]."""
    return ffi.func("add_one_noting_buffers", output_shapes=[None, [2]], output_dtypes=[None, "int64"], **options)


def _chain_of_two(fn: tf_op.Func) -> Callable[[tf.Tensor], tuple[tf.Tensor, ...]]:
    @tf.function(input_signature=[tf.TensorSpec([64], tf.float32)])
    def chain(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        y1, where1 = fn(x)
        y2, where2 = fn(y1)  # y1 has no other user: its buffer may become y2
        return y2, where1, where2

    return chain


def test_inplace_output_takes_the_buffer_of_an_unused_input(ffi: tf_op.Module) -> None:
    x = tf.constant(np.arange(64, dtype=np.float32))
    y, where1, where2 = _chain_of_two(_noting(ffi, inplace={0: 0}))(x)
    np.testing.assert_array_equal(y.numpy(), np.arange(64) + 2)
    assert where2[0] == where2[1], "y1's buffer was not reused for y2"
    # x is the caller's, still in use: never written over.
    assert where1[0] != where1[1]
    np.testing.assert_array_equal(x.numpy(), np.arange(64))


def test_without_inplace_every_output_is_allocated(ffi: tf_op.Module) -> None:
    _, where1, where2 = _chain_of_two(_noting(ffi))(tf.constant(np.zeros(64, np.float32)))
    assert where1[0] != where1[1] and where2[0] != where2[1]


def test_inplace_never_writes_over_a_tensor_still_in_use(ffi: tf_op.Module) -> None:
    fn = _noting(ffi, inplace={0: 0})

    @tf.function(input_signature=[tf.TensorSpec([64], tf.float32)])
    def kept(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        h = x * 2.0  # a fresh buffer, but returned too: it has two users
        y, where = fn(h)
        return h, y, where

    x = np.arange(64, dtype=np.float32)
    h, y, where = kept(tf.constant(x))
    np.testing.assert_array_equal(h.numpy(), 2 * x)
    np.testing.assert_array_equal(y.numpy(), 2 * x + 1)
    assert where[0] != where[1]
    # Eagerly, the caller holds every input.
    x_tf = tf.constant(x)
    y, where = fn(x_tf)
    np.testing.assert_array_equal(x_tf.numpy(), x)
    np.testing.assert_array_equal(y.numpy(), x + 1)
    assert where[0] == buffer_address(x_tf) != where[1]


def _transparent_huge_pages() -> str:
    """The kernel's THP mode (always, madvise or never), "" where it has none."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    text = path.read_text() if path.exists() else ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


def _thp_fault_fallbacks() -> int:
    """How often the kernel fell back to 4 KiB pages where a huge page was asked for."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


def _huge_page_kib(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if not first.endswith(":"):  # a mapping's header: "lo-hi perms ..."
            lo, hi = (int(bound, 16) for bound in first.split("-"))
            inside = lo <= address < hi
        elif inside and first == "AnonHugePages:":
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(_transparent_huge_pages() != "madvise",
                    reason=f"transparent huge pages are {_transparent_huge_pages() or 'absent'} here, not "
                           "madvise: only then do they depend on the op asking for them")
def test_a_large_fresh_output_gets_huge_pages(mod: tf_op.Module) -> None:
    """TF would allocate a 64 MiB output in 4 KiB pages; the op's output pool
    asks for huge pages for a new buffer before TVM writes it."""
    x = tf.fill([16 << 20], 1.0)
    fallbacks = _thp_fault_fallbacks()
    y = mod.func("add_one")(x)
    address = buffer_address(y)
    if _huge_page_kib(address + (32 << 20)) == 0 and _thp_fault_fallbacks() > fallbacks:
        pytest.skip("the kernel had no free huge page to give (thp_fault_fallback rose): memory is fragmented")
    assert _huge_page_kib(address + (32 << 20)) >= 2048, "the output's pages are all 4 KiB"
    assert _huge_page_kib(buffer_address(x) + (32 << 20)) == 0, "TF's own buffer got huge pages: not the op's doing"
    assert float(tf.reduce_min(y)) == float(tf.reduce_max(y)) == 2.0


# --- the output pool: small and large outputs' buffers kept for the kernel's next calls -----

SMALL = 16  # float32 elements: an output whose allocation by TF costs as much as the op
LARGE = (4 << 20) // 4  # float32 elements: the pool's smallest large output, 4 MiB
MID = LARGE // 2  # between the two: TF's allocator


def _output_allocations(mod: tf_op.Module, runs: int, size: int = LARGE) -> list[tuple[str, int]]:
    """(allocator, address) of an add-one's output of ``size`` elements in each of
    ``runs`` session runs, from TF's own step stats: one kernel, as a server's session."""
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [size])
        y = mod.func("add_one")(x)
        with tf.compat.v1.Session(graph=g) as sess:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            seen = []
            for k in range(runs):
                metadata = tf.compat.v1.RunMetadata()
                out = sess.run(y, {x: np.full(size, k, np.float32)}, options=options, run_metadata=metadata)
                assert (out == k + 1).all()
                seen += [(o.tensor_description.allocation_description.allocator_name,
                          o.tensor_description.allocation_description.ptr)
                         for dev in metadata.step_stats.dev_stats for node in dev.node_stats
                         if node.node_name == y.op.name for o in node.output]
    return seen


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_an_output_reuses_the_buffer_of_a_dropped_one(mod: tf_op.Module, size: int) -> None:
    # A run's result lives on (the fetched array shares its buffer) until the
    # next run returns: two buffers take turns.
    seen = _output_allocations(mod, 4, size)
    assert [allocator for allocator, _ in seen] == ["tvmdsoop_output_pool"] * 4, seen
    assert seen[2] == seen[0] and seen[3] == seen[1] != seen[0], f"not two buffers taking turns: {seen}"


def test_a_mid_sized_output_is_left_to_tf(mod: tf_op.Module) -> None:
    seen = _output_allocations(mod, 2, MID)
    assert len(seen) == 2 and all(allocator not in ("", "tvmdsoop_output_pool") for allocator, _ in seen), seen


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_output_pool_off_leaves_outputs_to_tf(mod: tf_op.Module, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setenv("TVMDSOOP_OUTPUT_POOL", "0")  # read when a kernel is made
    seen = _output_allocations(mod, 2, size)
    assert len(seen) == 2 and all(allocator not in ("", "tvmdsoop_output_pool") for allocator, _ in seen), seen


def test_output_pool_setting_is_checked(mod: tf_op.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TVMDSOOP_OUTPUT_POOL", "lots")
    with pytest.raises(tf.errors.InvalidArgumentError, match="TVMDSOOP_OUTPUT_POOL must be a number of buffers"):
        _output_allocations(mod, 1)


@pytest.mark.parametrize("size", [SMALL, LARGE])
def test_pooled_outputs_still_held_are_never_handed_out_again(mod: tf_op.Module, size: int) -> None:
    add_one = mod.func("add_one")
    held = [add_one(tf.fill([size], float(k))) for k in range(6)]  # more than the pool keeps
    del held[1::2]  # some back to the pool, the others still in use
    held += [add_one(tf.fill([size], float(k))) for k in range(10, 13)]
    for y, k in zip(held, [0, 2, 4, 10, 11, 12]):
        assert float(tf.reduce_min(y)) == float(tf.reduce_max(y)) == k + 1


def test_a_small_output_of_a_new_size_gets_a_buffer_large_enough(mod: tf_op.Module) -> None:
    """A smaller output may reuse the kept buffer; a larger one must not be
    written into it (glibc then aborts on the overrun heap, as it did when the
    capacity was not checked)."""
    add_one = mod.func("add_one")
    for n in (SMALL, 4 * SMALL, SMALL, 1, (64 << 10) // 4):  # grows, shrinks, shrinks, grows
        y = add_one(tf.fill([n], float(n)))
        np.testing.assert_array_equal(y.numpy(), np.full(n, n + 1, np.float32))
        del y  # its buffer back to the kernel before the next call


def test_small_outputs_of_concurrent_calls_stay_apart(mod: tf_op.Module) -> None:
    """Calls of one kernel from many threads each get a buffer of their own: the
    slot a kernel keeps is taken by one of them at a time."""
    add_one = tf.function(mod.func("add_one"), input_signature=[tf.TensorSpec([SMALL], tf.float32)])
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for k in range(300):
                value = float(seed * 1000 + k)
                y = add_one(tf.fill([SMALL], value))
                assert (y.numpy() == value + 1).all(), (seed, k, y.numpy())
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_inplace_survives_a_saved_model(ffi: tf_op.Module, tmp_path: Path) -> None:
    holder = tf.Module()
    holder.fn = _noting(ffi, inplace={0: 0})
    holder.chain = _chain_of_two(holder.fn)
    tf.saved_model.save(holder, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    y, _, where2 = loaded.chain(tf.constant(np.ones(64, np.float32)))
    np.testing.assert_array_equal(y.numpy(), np.full(64, 3, np.float32))
    assert where2[0] == where2[1]


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"inplace": {2: 0}}, ValueError, r"inplace maps an output \(0 to 1\) to an input \(>= 0\), got 2: 0"),
        ({"inplace": {0: -1}}, ValueError, r"inplace maps an output .*, got 0: -1"),
        ({"inplace": [0]}, TypeError, r"inplace must map outputs to inputs"),
        ({"inplace": {0: 0}, "returns": True}, ValueError, r"returns its outputs, so none can be written over"),
    ],
)
def test_inplace_checked_when_the_function_is_made(ffi: tf_op.Module, options: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        _noting(ffi, **options)


@pytest.mark.parametrize(
    ("attr", "pattern"),
    [
        ([0], r"inplace has 1 entries for 2 outputs"),
        ([1, -1], r"inplace: output 0 names input 1, but the op has 1 input"),
        ([-1, 0], r"inplace: output 1 \(int64\) cannot be written over input 0 \(float\)"),
        ([-2, -1], r"inplace: output 0 names input -2"),
    ],
)
def test_inplace_checked_by_the_op(ffi: tf_op.Module, attr: list[int], pattern: str) -> None:
    """Graphs made elsewhere (Go, raw ops) reach the op's own checks."""
    fn = _noting(ffi)
    with pytest.raises(tf.errors.InvalidArgumentError, match="function 'add_one_noting_buffers': " + pattern):
        _library.load().tvmdso_op(
            args=[tf.zeros([64])], output_dims=[], library=ffi.lib_path,
            Tout=[tf.float32, tf.int64], output_shapes=[tf.TensorShape(None), [2]],
            func_name=fn.func_name, inplace=attr,
        )


def test_inplace_names_an_input_the_kernel_can_keep(ffi: tf_op.Module) -> None:
    """The kernel keeps the input an output may be written over in 16 bits, next
    to the dtype: a larger index is refused, never wrapped around."""
    x = tf.zeros([64])
    with pytest.raises(tf.errors.InvalidArgumentError, match="names input 32768; only inputs up to 32767"):
        _library.load().tvmdso_op(
            args=[x] * 32769, output_dims=[], library=ffi.lib_path, Tout=[tf.float32],
            output_shapes=[tf.TensorShape(None)], func_name="add_one", inplace=[32768],
        )


# --- the error contract: docs/errors.md, one test per row --------------------------


def raw_op(library: Path, x: tf.Tensor) -> tf.Tensor:
    """The op on add_one of library, added without tf_op.Module's checks."""
    return tf_op.ops().tvmdso_op(
        args=[x], output_dims=[], Tout=[tf.float32], output_shapes=[tf.TensorShape(None)],
        library=str(library), func_name="add_one",
    )


@pytest.mark.parametrize(
    ("case", "error", "pattern"),
    [
        ("missing path", tf.errors.NotFoundError, r"missing\.so"),
        ("not a library", tf.errors.InvalidArgumentError, r"notalib\.so"),
        ("no such function", tf.errors.NotFoundError, r"'nope'.*no function of that name"),
        ("symbol is data, not code", tf.errors.NotFoundError, r"'not_code'.*data, not a function"),
        ("name reserved for TVM's symbols", tf.errors.InvalidArgumentError, r"'_library_bin'.*reserved for TVM's own symbols"),
        ("too few inputs", tf.errors.InvalidArgumentError, r"vector_add.*Expected 3 arguments"),
        ("too many outputs", tf.errors.InvalidArgumentError, r"add_one.*Expected 2 arguments"),
        ("wrong dtype", tf.errors.InvalidArgumentError, r"add_one.*float32"),
        ("wrong rank", tf.errors.InvalidArgumentError, r"matrix_add_one.*ndim"),
        ("wrong shape", tf.errors.InvalidArgumentError, r"add_one_4.*expected 4"),
        ("negative output size", tf.errors.InvalidArgumentError, r"dimension 0 is -1"),
        ("bad alignment at the op", tf.errors.InvalidArgumentError, r"power of two"),
        ("function raises ValueError", tf.errors.InvalidArgumentError, r"deliberate failure"),
        ("function raises RuntimeError", tf.errors.UnknownError, r"RuntimeError: deliberate runtime"),
        ("returns a value instead of writing", tf.errors.InvalidArgumentError, r"returned a value.*returns=True"),
    ],
)
def test_error_contract(case: str, error: type, pattern: str, testlib: str, ffilib: str, tmp_path) -> None:
    mod, ffi = tf_op.Module(testlib), tf_op.Module(ffilib)
    x = tf.constant([1.0, 2.0, 3.0])
    notalib = tmp_path / "notalib.so"
    notalib.write_text("text")
    calls = {
        # tf_op.Module refuses these when made (test_module_errors.py): the op, given them, says why too.
        "missing path": lambda: raw_op(tmp_path / "missing.so", x),
        "not a library": lambda: raw_op(notalib, x),
        "no such function": lambda: mod.func("nope")(x),
        # Called, it would jump into data: the process would die of SIGSEGV.
        "symbol is data, not code": lambda: ffi.func("not_code")(x),
        # The module blob every export_library with imports carries: data again.
        "name reserved for TVM's symbols": lambda: mod.func("_library_bin")(x),
        "too few inputs": lambda: mod.func("vector_add")(x),
        "too many outputs": lambda: mod.func("add_one", output_shapes=[None, None])(x),
        "wrong dtype": lambda: mod.func("add_one")(tf.constant([1], tf.int64)),
        "wrong rank": lambda: mod.func("matrix_add_one")(x),
        "wrong shape": lambda: mod.func("add_one_4")(x),
        "negative output size": lambda: mod.func("add_one", output_shape=[tf.constant(-1)])(x),
        "bad alignment at the op": lambda: tf_op.ops().tvmdso_op(
            args=[x], output_dims=[], Tout=[tf.float32],
            output_shapes=[tf.TensorShape(None)], library=testlib, func_name="add_one", alignment=3,
        ),
        "function raises ValueError": lambda: ffi.func("raise_value_error")(x),
        "function raises RuntimeError": lambda: ffi.func("raise_runtime_error")(x),
        "returns a value instead of writing": lambda: ffi.func("count_instead_of_writing")(x),
    }
    with pytest.raises(error, match=f"(?s){pattern}"):
        calls[case]()
    # Nothing aborted; the next good call works.
    np.testing.assert_array_equal(mod.func("add_one")(x).numpy(), [2.0, 3.0, 4.0])


# --- threads ---------------------------------------------------------------------


def test_many_threads_same_and_different_functions(mod: tf_op.Module) -> None:
    add_one, vector_add, row_sum = mod.func("add_one"), mod.func("vector_add"), mod.func("row_sum", output_shape=[8])

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            a = rng.standard_normal(257).astype(np.float32)
            m = rng.standard_normal((8, 5)).astype(np.float32)
            np.testing.assert_array_equal(add_one(tf.constant(a)).numpy(), a + 1)
            np.testing.assert_array_equal(vector_add(tf.constant(a), tf.constant(a)).numpy(), a + a)
            np.testing.assert_allclose(row_sum(tf.constant(m)).numpy(), m.sum(axis=1), rtol=1e-5)

    run_in_threads(worker, 8)


def test_parallel_ops_in_one_graph(mod: tf_op.Module) -> None:
    add_one = mod.func("add_one")

    @tf.function
    def f(x: tf.Tensor) -> list[tf.Tensor]:
        return [add_one(x + float(k)) for k in range(32)]  # independent: TF runs them at once

    outs = f(tf.constant(np.arange(1000, dtype=np.float32)))
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out.numpy(), np.arange(1000) + k + 1)


# --- graphs written for TVM 0.7-0.19's TvmDsoOp ------------------------------------


@pytest.mark.parametrize(
    ("func_name", "shape_input", "static_shape", "x", "expected"),
    [
        ("transpose", np.int64(0), [3, 2], np.arange(6, dtype=np.float32).reshape(2, 3), lambda x: x.T),
        ("transpose", np.array([3, 2]), None, np.arange(6, dtype=np.float32).reshape(2, 3), lambda x: x.T),
        ("add_one", np.int64(0), None, np.arange(4, dtype=np.float32), lambda x: x + 1),
    ],
    ids=["static attr", "dynamic shape tensor", "first input's shape"],
)
def test_legacy_graphdef_runs_unchanged(testlib: str, func_name, shape_input, static_shape, x, expected) -> None:
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(legacy_graph(testlib, func_name, shape_input, static_shape), name="")
        with tf.compat.v1.Session(graph=g) as sess:
            out = sess.run("tvm:0", feed_dict={"x:0": x})
    np.testing.assert_array_equal(out, expected(x))


# --- inputs found by review: none may hang, abort or be silently changed ----------


@pytest.mark.parametrize("name", ["lib.so.1", "LIB.SO", "noextension", "lib.so_1"])
def test_library_file_name_does_not_matter(tmp_path, testlib: str, name: str) -> None:
    # SavedModel assets get renamed ("lib.so_1"), sonames carry versions.
    copy = tmp_path / name
    copy.write_bytes(Path(testlib).read_bytes())
    np.testing.assert_array_equal(tf_op.Module(copy).func("add_one")(tf.constant([1.0])).numpy(), [2.0])


def test_non_regular_file_is_refused_not_read(tmp_path) -> None:
    fifo = tmp_path / "fifo.so"
    os.mkfifo(fifo)  # hashing it would block forever
    for path in (fifo, "/dev/zero"):
        # tf_op.Module refuses it when made; the op, given it, refuses it too.
        with pytest.raises(ValueError, match="not a regular file"):
            tf_op.Module(path)
        with pytest.raises(tf.errors.InvalidArgumentError, match="not a regular file"):
            raw_op(path, tf.constant([1.0]))


CRASHING_LIBRARY = """
#include <stdlib.h>
__attribute__((constructor)) static void crash_while_loading(void) { abort(); }
int __tvm_ffi_add_one(void) { return 0; }
"""

CALL_ADD_ONE_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import tf_op

    try:
        tf_op.Module(sys.argv[1], sha256="").func("add_one")(tf.constant([1.0]))
    except tf.errors.OpError as e:
        print(type(e).__name__, e.message)
    """
)


@pytest.fixture
def crashing_library(tmp_path) -> Path:
    """CRASHING_LIBRARY, compiled: loaded in a process, it aborts it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the crashing library (the op library's build needs one too)"
    (tmp_path / "crash.c").write_text(CRASHING_LIBRARY)
    lib = tmp_path / "crash.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "crash.c")], check=True)
    return lib


def test_library_that_crashes_while_loading_is_refused(crashing_library: Path) -> None:
    """A library with no pinned digest (sha256="") is loaded by tvmdsoop-probe
    first (found beside the op library, or named by TVMDSOOP_PROBE): one whose constructor
    aborts is refused, and the process that asked lives on. The call runs in a
    child, so that without the probe this test fails, not the session."""
    lib = crashing_library
    done = run_python(CALL_ADD_ONE_SCRIPT, str(lib))
    assert done.returncode == 0, (
        f"the process died loading {lib} (exit {done.returncode}): no tvmdsoop-probe beside the op "
        f"library?\n{done.stderr[-2000:]}"
    )
    assert "separate process failed: tvmdsoop-probe ended by aborted" in done.stdout, done.stdout


def test_module_of_a_library_that_crashes_while_loading_is_refused_when_made(crashing_library: Path) -> None:
    """tf_op.Module(path) pins the digest of the file it is given: the probe
    (which the op skips for a pinned library) tries it when the Module is
    made, in a process of its own."""
    lib = crashing_library
    made = run_python("import sys, tf_op\ntry:\n    tf_op.Module(sys.argv[1])\nexcept ValueError as e:\n"
                      "    print('refused:', e)\n", str(lib))
    assert made.returncode == 0, f"the process died making a Module of {lib}:\n{made.stderr[-2000:]}"
    assert f"refused: tf_op: library {lib}: " in made.stdout and "tvmdsoop-probe ended by aborted" in made.stdout, \
        made.stdout


def test_nul_bytes_are_refused(testlib: str, mod: tf_op.Module) -> None:
    with pytest.raises(ValueError, match="NUL"):
        tf_op.Module(testlib + "\x00junk")
    with pytest.raises(ValueError, match="NUL"):
        mod.func("add_one\x00junk")
    with pytest.raises(tf.errors.InvalidArgumentError, match="NUL"):
        tf_op.ops().tvmdso_op(
            args=[tf.constant([1.0])], output_dims=[], library=testlib + "\x00/evil",
            Tout=[tf.float32], output_shapes=[tf.TensorShape(None)], func_name="add_one",
        )


@pytest.mark.parametrize("alignment", [np.int64(64), np.int32(128)])
def test_numpy_int_alignment(mod: tf_op.Module, alignment: int) -> None:
    np.testing.assert_array_equal(mod.func("add_one", alignment=alignment)(tf.constant([1.0])).numpy(), [2.0])


@pytest.mark.parametrize("alignment", [2**31, 2**63])
def test_absurd_alignment(mod: tf_op.Module, alignment: int) -> None:
    with pytest.raises(ValueError, match="power of two from 1 to"):
        mod.func("add_one", alignment=alignment)


@pytest.mark.parametrize(
    ("shape", "error"),
    [
        ([2**62], tf.errors.ResourceExhaustedError),
        ([2**40, 2**40], tf.errors.InvalidArgumentError),
        (tf.constant([2**40, 2**40], tf.int64), tf.errors.InvalidArgumentError),
    ],
)
def test_huge_output_shapes_name_the_function(mod: tf_op.Module, shape, error: type) -> None:
    with pytest.raises(error, match="add_one"):
        mod.func("add_one", output_shape=shape)(tf.constant([1.0]))


def test_sha256_taken_when_the_module_is_made(tmp_path, testlib: str) -> None:
    """A library must exist when its Module is made (test_module_errors.py): its
    digest is taken then, and a file put in its place afterwards is refused."""
    path = tmp_path / "lib.so"
    path.write_bytes(Path(testlib).read_bytes())
    module = tf_op.Module(path)
    assert module.sha256 == hashlib.sha256(Path(testlib).read_bytes()).hexdigest()
    np.testing.assert_array_equal(module.func("add_one")(tf.constant([1.0])).numpy(), [2.0])


SHIFT_LIBRARY = """
#include <tvm/ffi/c_api.h>

int __tvm_ffi_shift(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  const DLTensor* x = (const DLTensor*)args[0].v_ptr;
  const DLTensor* y = (const DLTensor*)args[1].v_ptr;
  for (int64_t i = 0; i < x->shape[0]; ++i) ((float*)y->data)[i] = ((const float*)x->data)[i] + SHIFT;
  result->type_index = kTVMFFINone;
  return 0;
}
"""


def test_a_library_rebuilt_at_its_path_serves_new_kernels(tmp_path: Path) -> None:
    """Kernels of one function share what they resolved: a library rebuilt at the
    same path is another library, which kernels made after it call, while those
    made before keep calling the old one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the libraries (the op library's build needs one too)"
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "shift.c").write_text(SHIFT_LIBRARY)
    for shift in (1, 2):
        subprocess.run([cc, "-shared", "-fPIC", f"-DSHIFT={shift}.0f", f"-I{repo / 'third_party/tvm-ffi/include'}",
                        f"-I{repo}", "-o", str(tmp_path / f"shift{shift}.so"), str(tmp_path / "shift.c")], check=True)
    path = tmp_path / "lib.so"
    x = tf.constant([1.0, 2.0])
    shutil.copy(tmp_path / "shift1.so", path)
    old = tf.function(tf_op.Module(path).func("shift"))
    np.testing.assert_array_equal(old(x).numpy(), [2.0, 3.0])
    os.replace(shutil.copy(tmp_path / "shift2.so", tmp_path / "new.so"), path)
    new = tf.function(tf_op.Module(path).func("shift"))
    np.testing.assert_array_equal(new(x).numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(old(x).numpy(), [2.0, 3.0])


@pytest.mark.parametrize("static_shape", [[-3], [2**40, 2**40]])
def test_legacy_bad_static_shape_is_an_error_not_an_abort(testlib: str, static_shape: list[int]) -> None:
    graph_def = legacy_graph(testlib, "add_one", np.int64(0), static_shape)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="static_output_shape"):
        with tf.Graph().as_default() as g:
            tf.graph_util.import_graph_def(graph_def, name="")
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run("tvm:0", feed_dict={"x:0": np.zeros(4, np.float32)})
