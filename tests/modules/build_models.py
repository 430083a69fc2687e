"""Builds the whole-model Relax VM libraries the tests and the demo run.

    python build_models.py OUT_DIR [--target llvm|cuda ...]

The TVM half of the model pipeline: it imports TVM and never TensorFlow (their
LLVMs clash in one process); keras_cnn.py writes the .tflite files first. Each
library is ``tvm.compile(mod, target).export_library(path)``: a VM executable whose
entry points exist only inside a Relax VM. Target llvm writes NAME.so, target cuda
NAME_cuda.so. Writes, into OUT_DIR:

- ``cnn_b{B}.so`` for each ``cnn_b{B}.tflite`` there: ``main(image: f32[B,16,16,3])
  -> f32[B,10]``, weights baked in (the TFLite frontend makes them constants).
- ``mlp.so``: ``forward(x: f32[batch,16], p0, p1, p2, p3) -> f32[batch,8]``, an
  ``nn`` MLP whose params are inputs; ``mlp_params.npz`` holds p0..p3 (seeded) and
  ``mlp_params.json`` their names, source names, shapes and dtypes, in call order.
- ``two_outputs.so``: ``main(x: f32[n,4]) -> (x + 1, (x * 2, sum(x, axis=1)))``,
  a nested tuple.
- ``mlp_native.so``: mlp.so with its Relax functions compiled to native code
  (``exec_mode="compiled"``) and exported as tf_op.compile exports (with the
  digest record dsoop checks: ``compile_model.export_recorded``);
  ``mlp_native_unrecorded.so`` the same as TVM's own export writes it, without
  the record. CPU only.
- ``onnx_model.so`` and ``onnx_model.onnx``: ``main(x: f32[batch,8], y: f32[batch,4])
  -> (relu(x @ W), sigmoid(x @ W + y))``, W baked in.

CUDA on a machine without a GPU: TVM keeps CUDA source (not compiled code) in a
library unless its CUDA runtime loads, and that needs libcuda.so.1. ``enable_cuda``
preloads libcudart from the nvidia wheel and, only if no real driver loads, a stub
libcuda.so.1 built from cuda_stub.c; it then compiles kernels with the wheel's nvcc
into a fatbin holding sm_90 SASS and compute_90 PTX.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R

HERE = Path(__file__).resolve().parent
CU13 = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13"
NVCC = CU13 / "bin" / "nvcc"
CUDA_ARCH = "90"
MLP_SEED = 0


def target_of(name: str) -> tvm.target.Target:
    """``llvm`` or ``cuda`` (sm_90 with an llvm host: the VM and shape code run on the CPU)."""
    if name == "llvm":
        return tvm.target.Target("llvm")
    if name == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": f"sm_{CUDA_ARCH}"}, host="llvm")
    raise ValueError(f"unknown target {name!r}: use llvm or cuda")


def lib_name(stem: str, target: str) -> str:
    """NAME.so for llvm, NAME_cuda.so for cuda: both can sit in one folder."""
    return f"{stem}.so" if target == "llvm" else f"{stem}_{target}.so"


def _compile_fatbin(code: str, *_: object) -> bytes:
    """tvm_callback_cuda_compile: CUDA source -> fatbin (sm_90 SASS + compute_90 PTX)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "k.cu"), Path(tmp, "k.fatbin")
        src.write_text(code)
        arch = f"arch=compute_{CUDA_ARCH},code=[sm_{CUDA_ARCH},compute_{CUDA_ARCH}]"
        env = {**os.environ, "PATH": f"{NVCC.parent}:{os.environ.get('PATH', '')}"}
        subprocess.run([str(NVCC), "--fatbin", "-O3", "-gencode", arch, "-o", str(out), str(src)],
                       check=True, capture_output=True, env=env)
        return out.read_bytes()


def enable_cuda(stub_dir: Path) -> None:
    """Makes this process able to write CUDA libraries with compiled code. Idempotent.

    Loads libtvm_runtime_cuda.so (which ``import tvm`` skipped if it could not load)
    so that "ffi.Module.create.cuda" is registered: without it TVM stores the CUDA
    source only. A stub libcuda.so.1 is built into stub_dir, and loaded, only when no
    real driver is loadable; it never travels with the libraries."""
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        if os.environ.get("TVM_COMPILE_FORCE_FALLBACK"):
            raise RuntimeError("unset TVM_COMPILE_FORCE_FALLBACK: it makes TVM keep CUDA source")
        ctypes.CDLL(str(CU13 / "lib" / "libcudart.so.13"), mode=ctypes.RTLD_GLOBAL)
        try:
            ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # the real driver, if any
        except OSError:
            stub = Path(stub_dir) / "libcuda.so.1"  # in its own folder: never beside real libraries
            stub.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub),
                            str(HERE / "cuda_stub.c")], check=True)
            ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
        from tvm.base import _LOADED_LIBS
        from tvm_ffi.libinfo import load_lib_ctypes

        runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
        if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
            raise RuntimeError("libtvm_runtime_cuda.so loaded but registered no CUDA module factory")
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile_fatbin, override=True)


def _export(mod: tvm.IRModule, path: Path, target: str) -> Path:
    """Compiles a Relax module (the default pipeline: dlight schedules on GPU) and writes it."""
    if target == "cuda":
        enable_cuda(path.parent / "cuda_stub")  # else TVM would silently store CUDA source
    tvm.compile(mod, target=target_of(target)).export_library(str(path))
    return path


def build_cnn(tflite_path: Path, out: Path, target: str = "llvm") -> Path:
    """cnn_b{B}.tflite -> library with ``main(image)``. The frontend turns every TFLite
    weight into a relax.const, so the weights are baked in (its "params" function
    attribute only lists them again)."""
    import tflite  # the flatbuffer reader the frontend needs; not TensorFlow
    from tvm.relax.frontend.tflite import from_tflite

    model = tflite.Model.GetRootAsModel(Path(tflite_path).read_bytes(), 0)
    mod = from_tflite(model)
    return _export(mod, Path(out), target)


class MLP(nn.Module):
    """Linear(features, hidden) + ReLU + Linear(hidden, classes); by default 16, 32, 8."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.relu(self.fc1(x)))


def mlp_params() -> tuple[dict[str, np.ndarray], list[dict[str, object]]]:
    """Seeded values p0..pk, in the order ``forward`` takes them after x, and their
    description (the nn names fc1.weight, fc1.bias, ...; shapes; dtypes)."""
    _, params = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor(["batch", 16], "float32")}})
    rng = np.random.default_rng(MLP_SEED)
    values, info = {}, []
    for k, (source, p) in enumerate(params):
        shape = [int(d) for d in p.shape]
        values[f"p{k}"] = (rng.standard_normal(shape) * 0.5).astype(p.dtype)
        info.append({"name": f"p{k}", "source": source, "shape": shape, "dtype": str(p.dtype)})
    return values, info


def mlp_module() -> tvm.IRModule:
    mod, _ = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor(["batch", 16], "float32")}})
    return mod


def build_mlp(out_dir: Path, target: str = "llvm") -> Path:
    """mlp.so: ``forward(x, p0, p1, p2, p3)``, flat already: export_tvm appends the
    params to x as ordinary inputs (attr num_input=1). Also writes mlp_params.*."""
    out_dir = Path(out_dir)
    mod = mlp_module()
    values, info = mlp_params()
    np.savez(out_dir / "mlp_params.npz", **values)
    (out_dir / "mlp_params.json").write_text(json.dumps(info, indent=1) + "\n")
    return _export(mod, out_dir / lib_name("mlp", target), target)


def build_mlp_native(out_dir: Path, recorded: bool) -> Path:
    """mlp_native.so, or mlp_native_unrecorded.so (see the module's docstring)."""
    sys.path.insert(0, str(HERE.parents[1] / "python"))  # tf_op_tvm, from this checkout
    from tf_op_tvm import compile_model

    target = target_of("llvm")
    built = compile_model.compile_relax(mlp_module(), target, "default")
    path = Path(out_dir) / ("mlp_native.so" if recorded else "mlp_native_unrecorded.so")
    if recorded:
        with tempfile.TemporaryDirectory() as work:
            compile_model.export_recorded(built, target, path, Path(work))
    else:
        built.export_library(str(path))
    return path


@I.ir_module
class TwoOutputs:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")):
        with R.dataflow():
            a = R.add(x, R.const(1.0, "float32"))
            b = R.multiply(x, R.const(2.0, "float32"))
            c = R.sum(x, axis=1)
            out = (a, (b, c))
            R.output(out)
        return out


def build_two_outputs(out_dir: Path, target: str = "llvm") -> Path:
    """two_outputs.so: a nested tuple result, three tensors when flattened."""
    return _export(TwoOutputs, Path(out_dir) / lib_name("two_outputs", target), target)


def onnx_model() -> "onnx.ModelProto":  # noqa: F821
    """Two inputs, two outputs, one baked-in weight; the batch is symbolic."""
    import onnx
    from onnx import TensorProto, helper

    w = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["mm"]),
            helper.make_node("Relu", ["mm"], ["relu"]),
            helper.make_node("Add", ["mm", "y"], ["sum"]),
            helper.make_node("Sigmoid", ["sum"], ["sigmoid"]),
        ],
        "two_in_two_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("relu", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("sigmoid", TensorProto.FLOAT, ["batch", 4])],
        initializer=[onnx.numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def build_onnx(out_dir: Path, target: str = "llvm") -> Path:
    """onnx_model.so (W baked in: keep_params_in_input=False) and onnx_model.onnx, from
    which the tests compute the reference with onnx.reference.ReferenceEvaluator."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx_model()
    onnx.save(model, str(Path(out_dir) / "onnx_model.onnx"))
    mod = from_onnx(model, keep_params_in_input=False)
    return _export(mod, Path(out_dir) / lib_name("onnx_model", target), target)


def build_all(out_dir: Path, target: str = "llvm") -> list[Path]:
    """Every library for one target; one failing model is reported and skipped."""
    out_dir = Path(out_dir)
    jobs: list[tuple[str, Callable[[], Path]]] = [
        (f"cnn_b{p.stem[len('cnn_b'):]}", lambda p=p: build_cnn(p, out_dir / lib_name(p.stem, target), target))
        for p in sorted(out_dir.glob("cnn_b*.tflite"))
    ]
    if target == "llvm":
        jobs += [("mlp_native", lambda: build_mlp_native(out_dir, recorded=True)),
                 ("mlp_native_unrecorded", lambda: build_mlp_native(out_dir, recorded=False))]
    jobs += [("mlp", lambda: build_mlp(out_dir, target)),
             ("two_outputs", lambda: build_two_outputs(out_dir, target)),
             ("onnx_model", lambda: build_onnx(out_dir, target))]
    written = []
    for name, job in jobs:
        start = time.perf_counter()
        try:
            path = job()
        except Exception as err:  # noqa: BLE001  (one model must not stop the others)
            print(f"skipped {name} for {target}: {type(err).__name__}: {str(err).strip().splitlines()[-1]}")
            continue
        print(f"wrote {path} ({time.perf_counter() - start:.1f} s)")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--target", nargs="+", choices=["llvm", "cuda"], default=["llvm"])
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not any(args.out_dir.glob("cnn_b*.tflite")):
        print(f"no cnn_b*.tflite in {args.out_dir}: run keras_cnn.py first to get the CNN libraries")
    for target in args.target:
        build_all(args.out_dir, target)


if __name__ == "__main__":
    main()
