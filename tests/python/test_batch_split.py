"""A batch run as calls of the model at a chunk of it (tf_op_tvm.batch_split),
where no operation mixes samples and the activations outgrow the caches."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import TVM_PYTHON
from test_compiler import TVM_PACKAGE

from tf_op import compile

#: Run on the TVM Python with the package's directory: for each module, whether
#: split_batch split it, the calls ``main`` makes of ``main_chunk``, and whether
#: TVM's VM gives the same outputs to the bit before and after.
_MODULES = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R
import batch_split

rng = np.random.default_rng(0)
W = R.const(rng.standard_normal((3, 3, 3, 16)).astype("float32"))
B = R.const(rng.standard_normal((16,)).astype("float32"))
D = R.const(rng.standard_normal((16, 10)).astype("float32"))


@I.ir_module
class Images:  # samples kept apart, two outputs: split in chunks of 2 (4 KiB an activation a sample)
    @R.function
    def main(x: R.Tensor((4, 8, 8, 3), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, W, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="HWIO", out_layout="NHWC")
            r = R.clip(R.add(c, B), 0.0, 6.0)
            p = R.nn.max_pool2d(r, pool_size=[2, 2], strides=[2, 2], layout="NHWC")
            f = R.reshape(p, (4, 4 * 4 * 16))
            m = R.mean(R.reshape(f, (4, 16, 16)), axis=[1])
            logits = R.nn.softmax(R.matmul(m, D), axis=-1)
            out = (logits, R.permute_dims(p, [0, 3, 1, 2]))
            R.output(out)
        return out


@I.ir_module
class BatchMean:  # batch statistics
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.subtract(x, R.mean(x, axis=[0], keepdims=True))
            R.output(y)
        return y


@I.ir_module
class Reversed:  # the batch's order reversed: a slice along axis 0 of its extent
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.strided_slice(x, axes=[0], begin=[3], end=[-5], strides=[-1])
            R.output(y)
        return y


@I.ir_module
class Transposed:  # a reshape through another first dimension, back to the batch's
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.reshape(R.permute_dims(R.reshape(x, (4, 2, 4)), [1, 0, 2]), (4, 8))
            R.output(y)
        return y


@I.ir_module
class WeightInput:  # a weight that is an input of the batch's extent: rows of w mix samples
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


@I.ir_module
class PerSampleConstant:  # a constant with a row for each sample
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.add(x, R.const(np.arange(32, dtype="float32").reshape(4, 8)))
            R.output(y)
        return y


@I.ir_module
class Softmax0:  # normalized across the batch
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.nn.softmax(x, axis=0)
            R.output(y)
        return y


@I.ir_module
class Cumsum:  # an operation batch_split does not know
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.cumsum(x, axis=1)
            R.output(y)
        return y


def run(mod, args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [o.numpy() for o in out] if type(out).__name__ == "Array" else [out.numpy()]


found = {}
for name, mod in (("Images", Images), ("BatchMean", BatchMean), ("Reversed", Reversed), ("Transposed", Transposed),
                  ("WeightInput", WeightInput), ("PerSampleConstant", PerSampleConstant), ("Softmax0", Softmax0),
                  ("Cumsum", Cumsum)):
    said = []
    # Images: two samples' largest activation; the others: any activation splits, where samples stay apart.
    batch_split.ACTIVATION_BUDGET = 8192 if name == "Images" else 0
    try:
        split = batch_split.split_batch(mod, said.append)
        calls = []
        relax.analysis.post_order_visit(split["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
                                        and isinstance(e.op, tvm.ir.GlobalVar) else None)
        args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]
        same = all(np.array_equal(a, b) for a, b in zip(run(mod, args), run(split, args), strict=True))
        found[name] = {"calls": len(calls), "said": said, "same": same,
                       "functions": sorted(gv.name_hint for gv in split.functions)}
    except Exception as err:  # one module's failure is its test's, not the others'
        found[name] = {"error": repr(err)}
batch_split.ACTIVATION_BUDGET = 1 << 20
found["within_budget"] = "main_chunk" in [gv.name_hint for gv in batch_split.split_batch(Images).functions]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def split_modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    script = tmp_path_factory.mktemp("batch_split") / "modules.py"  # TVMScript reads its source: a file, not -c
    script.write_text(_MODULES)
    result = subprocess.run([TVM_PYTHON, str(script), str(TVM_PACKAGE)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_samples_kept_apart_run_in_chunks_with_the_same_outputs(split_modules: dict[str, dict[str, object]]) -> None:
    """Convolution, bias, clip, pooling, reshapes that keep the batch first, a
    mean and a softmax over other axes, a product by a constant matrix, a
    transpose and two outputs: batch 4 in two calls of 2 samples (a budget of
    two samples' largest activation), outputs the same to the bit."""
    images = split_modules["Images"]
    assert images["functions"] == ["main", "main_chunk"], images
    assert images["calls"] == 2, images
    assert images["said"] == ["runs batch 4 as 2 calls of 2 samples, whose largest activation is 0.0 MiB"], images
    assert images["same"]


@pytest.mark.parametrize("name", ["BatchMean", "Reversed", "Transposed", "WeightInput", "PerSampleConstant",
                                  "Softmax0", "Cumsum"])
def test_models_that_mix_samples_stay_whole(split_modules: dict[str, dict[str, object]], name: str) -> None:
    found = split_modules[name]
    assert found["functions"] == ["main"] and found["calls"] == 0 and not found["said"], found
    assert found["same"]


def test_activations_within_the_budget_stay_whole(split_modules: dict[str, dict[str, object]]) -> None:
    assert split_modules["within_budget"] is False


def _big_images() -> keras.Model:
    """A CNN whose first activation is 2 MiB an image (128x128x32 float32)."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((128, 128, 3)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])


def test_compiled_batches_of_big_images_run_in_chunks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """tf_op.compile at batch 4: two calls of two images (4 MiB of first
    activation each), Keras's values; batch 1 stays one call."""
    model = _big_images()
    caplog.set_level(logging.INFO, logger="tf_op.compiler")
    compiled = compile(model, cache_dir=tmp_path, batch_sizes=[4, 1])
    assert "runs batch 4 as 2 calls of 2 samples, whose largest activation is 4.0 MiB" in caplog.text
    assert caplog.text.count("runs batch") == 1, caplog.text
    for batch in (4, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 128, 128, 3)).astype(np.float32)
        want = model(x).numpy()
        np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
