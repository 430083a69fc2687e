"""11, peers: each model at each batch run by TF, XLA, TFLite (XNNPACK), ONNX Runtime (via tf2onnx) and
tf_op.compile (and tuned, with --tune), all in one process, timed in turns (timing.interleave), with the
same threads: the CPUs this process may run on. Every engine's output is checked against TF's; an engine
that cannot take a model gets a skipped cell with the reason, never a failed section.

Keys, ``p = peers_{model}_b{batch}_``: ``p{engine}_us`` (median over rounds), ``p{engine}_vs_tf`` (TF's
time / the engine's in each round, median and quartiles), ``p{engine}_err`` (max |engine - TF| / max |TF|),
``p{engine}_first_s`` (seconds to the first output: trace, convert or compile, load, one call),
``p{engine}_skipped`` (why there is no figure), ``p{tvm engine}_vs_{rival}`` (a rival's time / ours in
each round, median, for ``PEERS_RIVALS``); for tf_op.auto, ``pauto_clusters`` (each cluster's status and
size) and ``pauto_tvm_flops_share`` (the share of the model's convolution and matmul FLOPs in clusters kept on
TVM).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

import tf_op
from common import PEERS_CACHE, PEERS_MODELS, PEERS_RIVALS, PEERS_TOLERANCE, ROOT, TVM_BESIDE_TF, Results
from timing import interleave, quartiles
from tf_op.compiler import flops
from tf_op.compiler.tflite_conversion import to_tflite  # tf_op's own converter settings, so TFLite runs what TVM gets

THREADS = len(os.sched_getaffinity(0))
Call = Callable[[], object]


def cnn() -> keras.Model:
    """The demo's CNN (tests/modules/keras_cnn.py) on 32x32 images: its layers take any spatial size."""
    sys.path.insert(0, str(ROOT / "tests" / "modules"))
    from keras_cnn import build_model

    return keras.Sequential([keras.Input((32, 32, 3)), *build_model().layers], name="cnn32")


def transformer() -> keras.Model:
    """The demo's encoder block (tests/modules/keras_transformer.py): 64 tokens x 128, 4 heads, exact gelu."""
    sys.path.insert(0, str(ROOT / "tests" / "modules"))
    from keras_transformer import build_model

    return build_model()


def bert_layer() -> keras.Model:
    """The same block at BERT-base's widths: 128 tokens x 768, 12 heads of 64, FFN 768-3072-768. Its products
    have 768 and 3072 columns, whose register tiles (3 of AVX-512's vectors) once compiled 28x slower than TF's
    (CHANGELOG, Fixed)."""
    sys.path.insert(0, str(ROOT / "tests" / "modules"))
    from keras_transformer import build_model

    return build_model(tokens=128, width=768, heads=12, ffn_width=3072, name="bert_layer")


def lstm() -> keras.Model:
    return keras.Sequential([keras.Input((32, 16)), keras.layers.LSTM(64), keras.layers.Dense(10)], name="lstm")


def application(name: str) -> Callable[[], keras.Model]:
    """A keras.applications model at 224x224, random weights (nothing downloaded), logits out."""
    return lambda: getattr(keras.applications, name)(weights=None, input_shape=(224, 224, 3), classifier_activation=None)


BUILDERS: dict[str, Callable[[], keras.Model]] = {
    "cnn": cnn, "transformer": transformer, "lstm": lstm, "mobilenetv2": application("MobileNetV2"),
    "resnet50": application("ResNet50"), "efficientnetb0": application("EfficientNetB0"), "bert_layer": bert_layer}


def reason(err: BaseException) -> str:
    """An exception as one short table-safe line: its type, its message's start and end (where errors say why)."""
    text = f"{type(err).__name__}: {' '.join(str(err).split())}".replace("|", "/")
    return text if len(text) <= 130 else f"{text[:50]} … {text[-80:]}"


def tflite_interpreter(model: bytes) -> tuple[object, str]:
    """LiteRT's interpreter (ai_edge_litert), where installed: tf.lite.Interpreter is deprecated and warns it
    is going; the same runtime either way, XNNPACK applied by default (experimental_op_resolver_type AUTO)."""
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter(model_content=model, num_threads=THREADS), "ai_edge_litert"
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(model_content=model, num_threads=THREADS), "tf.lite"


def tflite_engine(concrete: tf.types.experimental.ConcreteFunction, x: np.ndarray, name: str, out: Results) -> Call:
    interpreter, out["peers_tflite_interpreter"] = tflite_interpreter(to_tflite(concrete, name))
    interpreter.allocate_tensors()
    (inp,), (outp,) = interpreter.get_input_details(), interpreter.get_output_details()

    def call() -> np.ndarray:  # numpy in, numpy out: the interpreter's own API
        interpreter.set_tensor(inp["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(outp["index"])

    return call


def ort_engine(graph: Callable[..., object], x: np.ndarray) -> Call:
    """tf2onnx's conversion of the TF graph (opset 17: LayerNormalization is one op), in an ONNX Runtime session
    with THREADS intra-op threads that sleep between runs, its other settings the defaults."""
    import onnxruntime as ort
    import tf2onnx
    from tf2onnx import tf_loader

    # tf2onnx.convert.from_function makes every placeholder of the function an input, those of the constants it
    # captures too (EfficientNet's Normalization), which then have no value: frozen here, the argument the one input.
    concrete = graph.get_concrete_function()
    args = len(tf.nest.flatten(concrete.structured_input_signature))
    names = [t.name for t in concrete.inputs[:args]], [t.name for t in concrete.outputs]
    frozen = tf_loader.from_function(concrete, *names)
    proto, _ = tf2onnx.convert.from_graph_def(frozen, input_names=names[0], output_names=names[1], opset=17)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    # Its threads otherwise spin after each run, on the CPUs the next engine in the round needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: x})[0]


def engines(model: keras.Model, compiled: dict[str, tf_op.CompiledFunction], x_np: np.ndarray,
            out: Results, prefix: str) -> dict[str, Callable[[], Call]]:
    """Each engine's setup for this input: returns its call (what the rounds time); any failure, a skipped cell."""
    x, spec = tf.constant(x_np), [tf.TensorSpec(x_np.shape, tf.float32)]
    graph = tf.function(lambda t: model(t, training=False), input_signature=spec)
    setups: dict[str, Callable[[], Call]] = {
        "tf": lambda: functools.partial(graph, x),
        "xla": lambda: functools.partial(tf.function(lambda t: model(t, training=False), input_signature=spec,
                                                     jit_compile=True), x),
        "tflite": lambda: tflite_engine(graph.get_concrete_function(), x_np, model.name, out),
        "ort": lambda: ort_engine(graph, x_np)}
    for variant, fn in compiled.items():
        # In a tf.function, as a model's part; the first call compiles. And
        # called eagerly, as a user runs the compiled model alone: a tf.function
        # call costs 0.1-0.2 ms here, which small models feel.
        setups[variant] = lambda fn=fn: functools.partial(tf.function(fn, input_signature=spec), x)
        setups[f"{variant}_eager"] = lambda fn=fn: functools.partial(fn, x)
    setups["auto"] = lambda: auto_engine(model, spec, x, out, prefix)  # last: the pass stays on while the rounds run
    return setups


#: The calls after tf_op.auto's first that its clusters spend timed against TF
#: (cluster_kernel.cc: six runs of each engine) before they keep the faster.
AUTO_TIMING_CALLS = 12


def auto_engine(model: keras.Model, spec: list[tf.TensorSpec], x: tf.Tensor, out: Results, prefix: str) -> Call:
    """The model's tf.function with tf_op.auto on, as a user turns it on: its
    first call compiles the clusters (the cell's first-call column), the next
    ones time each against TF (the pass's timing fallback) until it keeps the
    faster. The engines set up before it were traced with the pass off."""
    tf_op.auto.enable(cache_dir=PEERS_CACHE)
    graph = tf.function(lambda t: model(t, training=False), input_signature=spec)
    graph(x)
    for _ in range(AUTO_TIMING_CALLS):
        graph(x)
    clusters = tf_op.auto.report()
    out[f"{prefix}auto_clusters"] = ", ".join(f"{c.status} ({len(c.ops)} ops)" for c in clusters) or "none"
    # The share of the model's convolution and matmul work that runs on TVM:
    # the kept shapes' parts against the model's traced graph, by one count.
    total = flops.conv_matmul_flops(graph.get_concrete_function().graph)
    on_tvm = sum(s.flops for c in clusters for s in c.shape_records if s.status == "tvm")
    out[f"{prefix}auto_tvm_flops_share"] = on_tvm / total if total else 0.0
    return functools.partial(graph, x)


def measure(name: str, batch: int, model: keras.Model, compiled: dict[str, tf_op.CompiledFunction], rounds: int,
            out: Results) -> None:
    p = f"peers_{name}_b{batch}_"
    x_np = np.random.default_rng(batch).standard_normal((batch, *model.input_shape[1:])).astype(np.float32)
    calls: dict[str, Call] = {}
    want: np.ndarray | None = None
    for engine, setup in engines(model, compiled, x_np, out, p).items():
        try:
            started = time.perf_counter()
            call = setup()
            got = np.asarray(call())
            out[f"{p}{engine}_first_s"] = time.perf_counter() - started
            if engine == "tf":
                want = got
            else:  # relative to the output's scale: random-init logits can be tiny
                out[f"{p}{engine}_err"] = float(np.abs(got.reshape(want.shape) - want).max() / np.abs(want).max())
            calls[engine] = call
        except Exception as err:  # noqa: BLE001  (converters raise anything; each means: this engine cannot)
            if engine == "tf":
                raise
            out[f"{p}{engine}_skipped"] = reason(err)
            print(f"peers: {name} b{batch} {engine} skipped: {err}", file=sys.stderr, flush=True)
    t = interleave(calls, rounds=rounds, min_time=0.04, warmup=2)
    tf_op.auto.disable()  # the next model's engines are traced without the pass
    out[f"{p}tf_us"] = t.median("tf") * 1e6
    for engine in list(calls)[1:]:
        out[f"{p}{engine}_us"] = t.median(engine) * 1e6
        ratios = t.ratios("tf", engine)
        out[f"{p}{engine}_vs_tf"] = float(np.median(ratios))
        out[f"{p}{engine}_vs_tf_q1"], out[f"{p}{engine}_vs_tf_q3"] = quartiles(ratios)
        out[f"{p}{engine}_ok"] = "yes" if float(out[f"{p}{engine}_err"]) <= PEERS_TOLERANCE else "no"
    for rival in (r for r in PEERS_RIVALS if r in calls):  # ours against each directly: TF's own noise left out
        for engine in (e for e in calls if e.startswith("tvm")):
            out[f"{p}{engine}_vs_{rival}"] = float(np.median(t.ratios(rival, engine)))
    print(f"peers: {name} b{batch}: " + ", ".join(f"{e} {out[p + e + '_us']:.0f} us" for e in calls), flush=True)


def peers(rounds: int, tune: int = 0, models: Sequence[str] = ()) -> Results:
    """The section: each of ``models`` (default all) at each of its batches (common.PEERS_MODELS)."""
    models = list(models) or list(PEERS_MODELS)
    if unknown := set(models) - set(PEERS_MODELS):
        raise SystemExit(f"peers: no model {', '.join(sorted(unknown))}; there are {', '.join(PEERS_MODELS)}")
    # Before TF's runtime and TVM's pool start: the same threads for every engine.
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    os.environ.update({k: os.environ.get(k, v) for k, v in TVM_BESIDE_TF.items()})
    shutil.rmtree(PEERS_CACHE, ignore_errors=True)  # an empty cache: tf_op's first calls are real compiles
    out: Results = {"peers_rounds": rounds, "peers_threads": THREADS, "peers_tune_trials": tune,
                    "peers_models": ",".join(models), "peers_tflite_interpreter": "–",
                    **{f"peers_{k.lower()}": os.environ[k] for k in TVM_BESIDE_TF},
                    **{f"peers_version_{d.replace('-', '_')}": next((x.version for x in importlib.metadata.distributions(
                        name=d)), "missing") for d in ("onnxruntime", "tf2onnx", "ai-edge-litert")}}
    for name in models:
        keras.utils.set_random_seed(0)
        model = BUILDERS[name]()
        signature = [tf.TensorSpec([None, *model.input_shape[1:]], tf.float32)]
        compiled = {"tvm": tf_op.compile(model, signature, cache_dir=PEERS_CACHE)}
        if tune:
            compiled["tvm_tuned"] = tf_op.compile(model, signature, cache_dir=PEERS_CACHE, tune=tune)
        for batch in PEERS_MODELS[name]:
            measure(name, batch, model, compiled, rounds, out)
    return out
