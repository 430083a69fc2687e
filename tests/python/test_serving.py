"""Deployment: self-contained, relocatable SavedModels, libraries that cannot be
swapped, the allow-list, and the static archive that TensorFlow Serving links.

Every load runs in a fresh process, as a server would, so nothing the test
process loaded can help it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorflow.core.protobuf import saved_model_pb2

from tf_op.tvm_paths import tvm_library_path
from helpers import run_python

ROOT = Path(__file__).resolve().parents[2]
EXPORT_SCRIPT = ROOT / "tests" / "modules" / "export_saved_model.py"
STATIC_PROGRAM = ROOT / "build" / "run_saved_model"

LOAD_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import tf_op

    model = tf.saved_model.load(sys.argv[1])
    x = tf.constant(json.loads(sys.argv[2]), tf.float32)
    direct = model.serve(x)
    signature = model.signatures["serving_default"](x=x)
    print(json.dumps({
        "y": direct["y"].numpy().tolist(), "z": direct["z"].numpy().tolist(),
        "sig_y": signature["y"].numpy().tolist(), "sig_z": signature["z"].numpy().tolist(),
    }))
    """
)



def export_expected(tmp_path: Path, testlib: str) -> tuple[Path, dict]:
    """A SavedModel exported in a fresh process from a private copy of the
    library, then moved, with the original model and that copy deleted. Returns
    the moved model and the numbers Python computed before saving."""
    work = tmp_path / "export"
    subprocess.run([sys.executable, str(EXPORT_SCRIPT), testlib, str(work)], check=True, timeout=300)
    expected = json.loads((work / "expected.json").read_text())
    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(work / "model", moved)
    shutil.rmtree(work)
    return moved, expected


def test_relocated_savedmodel_runs_without_the_original_library(tmp_path: Path, testlib: str) -> None:
    model, expected = export_expected(tmp_path, testlib)
    assert list((model / "assets").iterdir()), "the library travels as an asset"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = run_python(LOAD_SCRIPT, str(model), json.dumps(expected["x"]), cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["y"] == expected["y"] and got["sig_y"] == expected["y"]
    assert got["z"] == expected["z"] and got["sig_z"] == expected["z"]


def test_tampered_library_is_refused(tmp_path: Path, testlib: str, ffilib: str) -> None:
    model, expected = export_expected(tmp_path, testlib)
    (asset,) = (model / "assets").iterdir()
    shutil.copy(ffilib, asset)  # another library under the same name
    done = run_python(LOAD_SCRIPT, str(model), json.dumps(expected["x"]))
    assert done.returncode != 0
    assert "PermissionDeniedError" in done.stderr
    assert str(asset) in done.stderr

    def digest(path: str) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    assert digest(ffilib) in done.stderr and digest(testlib) in done.stderr


ALLOW_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import tf_op

    try:
        y = tf_op.Module(sys.argv[1]).func("add_one")(tf.constant([1.0]))
        print("ran", y.numpy().tolist())
    except tf.errors.PermissionDeniedError as e:
        print("refused", e.message)
    """
)


@pytest.mark.parametrize(
    ("allowed", "outcome"),
    [("{libdir}", "ran [2.0]"), ("{other}:{libdir}", "ran [2.0]"), ("{other}", "refused"), ("{libdir}/sub", "refused")],
)
def test_allow_list(tmp_path: Path, testlib: str, allowed: str, outcome: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    value = allowed.format(libdir=Path(testlib).parent, other=other)
    done = run_python(ALLOW_SCRIPT, testlib, env={"TVMDSOOP_ALLOWED_DIRS": value})
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(outcome)
    if outcome == "refused":
        assert "TVMDSOOP_ALLOWED_DIRS" in line and "testfuncs.so" in line


def test_allow_list_sees_through_symlinks(tmp_path: Path, testlib: str) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link.so").symlink_to(testlib)  # points outside the allowed folder
    done = run_python(ALLOW_SCRIPT, str(allowed / "link.so"), env={"TVMDSOOP_ALLOWED_DIRS": str(allowed)})
    assert done.stdout.strip().splitlines()[-1].startswith("refused"), done.stderr[-2000:]


def signature_tensor_names(model: Path, outputs: tuple[str, ...] = ("y", "z")) -> tuple[str, list[str]]:
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]
    return signature.inputs["x"].name, [signature.outputs[k].name for k in outputs]


def test_static_archive_runs_the_savedmodel(tmp_path: Path, testlib: str) -> None:
    """The C++ program links libtvm_dso_op.a (no dlopen of the op library) and
    runs the relocated SavedModel through TF's C API."""
    assert STATIC_PROGRAM.is_file(), "make build makes build/run_saved_model"
    model, expected = export_expected(tmp_path, testlib)
    input_name, output_names = signature_tensor_names(model)
    done = subprocess.run(
        [str(STATIC_PROGRAM), str(model), input_name, *output_names, "--", *map(str, expected["x"])],
        capture_output=True, text=True, timeout=300,
        # A server names the TVM runtime's folders itself; Python's tf_op is not there.
        env={**os.environ, "TVMDSOOP_LIBRARY_PATH": tvm_library_path(), "TVMDSOOP_LIBRARY": "/nonexistent/not-loaded.so"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "linked in" in done.stderr
    y, z = ([float(v) for v in line.split()] for line in done.stdout.strip().splitlines())
    assert y == expected["y"] and z == expected["z"]



def test_static_archive_serves_a_compiled_function(tmp_path: Path) -> None:
    """tf_op.compile's SavedModel in the TF Serving path: the compiled batches run
    from the model's assets, chosen by the request's shape; another batch is
    refused with the list of compiled ones."""
    import numpy as np
    import tensorflow as tf
    import tf_op

    fast = tf_op.compile(lambda x: tf.tanh(0.5 * x) + 1.0, [tf.TensorSpec([None])], batch_sizes=[3, 5],
                         cache_dir=tmp_path / "cache")
    holder = tf.Module()
    holder.fast = fast
    holder.serve = tf.function(lambda x: {"y": fast(x)}, input_signature=[tf.TensorSpec([None], name="x")])
    model = tmp_path / "model"
    tf.saved_model.save(holder, str(model), signatures=holder.serve)
    shutil.rmtree(tmp_path / "cache")
    input_name, (output_name,) = signature_tensor_names(model, outputs=("y",))

    def serve(values: list[float]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(STATIC_PROGRAM), str(model), input_name, output_name, "--", *map(str, values)],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "TVMDSOOP_LIBRARY_PATH": tvm_library_path(), "TVMDSOOP_LIBRARY": "/nonexistent/not-loaded.so"},
        )

    for batch in (3, 5):
        x = np.linspace(-2, 2, batch, dtype=np.float32)
        done = serve(x.tolist())
        assert done.returncode == 0, done.stderr[-3000:]
        np.testing.assert_allclose([float(v) for v in done.stdout.split()], np.tanh(0.5 * x) + 1.0, rtol=1e-5)
    refused = serve([1.0, 2.0, 3.0, 4.0])
    assert refused.returncode == 1
    assert "compiled: [[3]]; [[5]]" in refused.stderr and "[4]" in refused.stderr


KERAS_EXPORT_SCRIPT = textwrap.dedent(
    """
    import shutil, sys
    import keras
    import tensorflow as tf
    import tf_op

    lib = shutil.copy(sys.argv[1], sys.argv[2])  # a private copy, deleted after export

    class AddOne(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.fn = tf_op.Module(lib).func("matrix_add_one")

        def call(self, x):
            return self.fn(x)

    inputs = keras.Input(shape=(4,))
    model = keras.Model(inputs, AddOne()(inputs) * 2.0)

    class Serving(tf.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def serve(self, x):
            return self.model(x)

    tf.saved_model.save(Serving(model), sys.argv[3])
    """
)


def test_keras_layer_carries_its_library(tmp_path: Path, testlib: str) -> None:
    private = tmp_path / "private.so"
    done = run_python(KERAS_EXPORT_SCRIPT, testlib, str(private), str(tmp_path / "model"))
    assert done.returncode == 0, done.stderr[-3000:]
    private.unlink()
    shutil.move(tmp_path / "model", tmp_path / "moved")
    load = "import sys, tensorflow as tf, tf_op; print(tf.saved_model.load(sys.argv[1]).serve(tf.ones([2, 4])).numpy().tolist())"
    done = run_python(load, str(tmp_path / "moved"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str([[4.0] * 4] * 2)


SAME_NAME_SCRIPT = textwrap.dedent(
    """
    import os, shutil, sys
    import tensorflow as tf
    import tf_op

    root = sys.argv[2]
    libs = []
    for sub in ("a", "b"):
        os.makedirs(os.path.join(root, sub))
        libs.append(shutil.copy(sys.argv[1], os.path.join(root, sub, "lib.so")))
    with open(libs[1], "ab") as f:  # other bytes (ELF loaders ignore a tail), so TF keeps both
        f.write(b"tail")

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.a = tf_op.Module(libs[0]).func("add_one")
            self.b = tf_op.Module(libs[1]).func("vector_add")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return self.a(x) + self.b(x, x)

    tf.saved_model.save(Model(), sys.argv[3])
    """
)


def test_two_libraries_with_one_file_name(tmp_path: Path, testlib: str) -> None:
    """TF saves them as assets lib.so and lib.so_1; both must load."""
    done = run_python(SAME_NAME_SCRIPT, testlib, str(tmp_path / "libs"), str(tmp_path / "model"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "model" / "assets").iterdir()) == ["lib.so", "lib.so_1"]
    shutil.rmtree(tmp_path / "libs")
    load = "import sys, tensorflow as tf, tf_op; print(tf.saved_model.load(sys.argv[1]).serve(tf.constant([1.0, 2.0])).numpy().tolist())"
    done = run_python(load, str(tmp_path / "model"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[4.0, 7.0]"
