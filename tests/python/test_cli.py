"""The tvmdsoop command (python -m tf_op): inspect, verify and compile, run as a user
would, in a process of its own, on libraries TVM and a C compiler made."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEGACY_FIXTURES = REPO / "tests" / "legacy" / "fixtures"

#: A TVM-FFI function, and a record of CPU features no CPU has, as
#: tf_op.compile writes one for a library compiled for another CPU.
FOREIGN_CPU_LIBRARY = """
#include <tvm/ffi/c_api.h>

__attribute__((visibility("default"))) const char tvmdsoop_cpu_flags[] = "sse2 tvmdsoop_no_such_flag";

int __tvm_ffi_noop(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  result->type_index = kTVMFFINone;
  return 0;
}
"""


def tvmdsoop(*args: str) -> subprocess.CompletedProcess:
    """Runs ``python -m tf_op ARGS`` in a fresh interpreter with the tests' environment."""
    return subprocess.run(
        [sys.executable, "-m", "tf_op", *args], capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )


def inspect_json(library: str | Path) -> dict:
    result = tvmdsoop("inspect", str(library), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_one_line_error(result: subprocess.CompletedProcess, status: int, pattern: str) -> None:
    """A failure the command expects: its status, one line of its own on stderr, no traceback."""
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    assert re.search(pattern, lines[-1]), lines[-1]
    # TensorFlow's import may log lines of its own before; the command writes one.
    assert len([line for line in lines if line.startswith("tvmdsoop")]) == 1, result.stderr


@pytest.fixture(scope="module")
def foreign_cpu_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the libraries (the op library's build needs one too)"
    out = tmp_path_factory.mktemp("foreign_cpu")
    (out / "foreign.c").write_text(FOREIGN_CPU_LIBRARY)
    subprocess.run([cc, "-shared", "-fPIC", f"-I{REPO / 'third_party/tvm-ffi/include'}", f"-I{REPO}",
                    "-o", str(out / "foreign.so"), str(out / "foreign.c")], check=True)
    return out / "foreign.so"


# --- inspect -------------------------------------------------------------------


def test_inspect_a_functions_library_as_json(testlib: str) -> None:
    info = inspect_json(testlib)
    assert info["kind"] == "functions"
    assert info["path"] == os.path.abspath(testlib)
    assert {"add_one", "vector_add", "sum9"} <= set(info["functions"])
    assert info["functions"] == sorted(info["functions"])
    # export_library's module blob is TVM's own symbol, not a function.
    assert "_library_bin" not in info["functions"]
    assert info["sha256"] == sha256_of(testlib)
    assert info["size"] == Path(testlib).stat().st_size
    assert info["tvm"] == ">=0.22"


def test_inspect_leaves_out_data_and_tvms_own_symbols(ffilib: str) -> None:
    functions = inspect_json(ffilib)["functions"]
    assert {"conj_complex64", "identity", "raise_value_error"} <= set(functions)
    # __tvm_ffi_not_code is an array; TVM_FFI_DLL_EXPORT_TYPED_FUNC's metadata getters are TVM's.
    assert "not_code" not in functions
    assert not [f for f in functions if f.startswith(("_metadata_", "_doc_", "_library"))]


def test_inspect_for_people(testlib: str) -> None:
    result = tvmdsoop("inspect", testlib)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == os.path.abspath(testlib)
    assert "kind:       functions library" in result.stdout
    assert "add_one" in result.stdout and sha256_of(testlib) in result.stdout
    assert "TVM >= 0.22" in result.stdout


def test_inspect_a_model_shows_its_entry_points_and_parameters(models_dir: Path) -> None:
    info = inspect_json(models_dir / "mlp.so")
    assert info["kind"] == "model"
    assert info["functions"] == ["forward"]
    assert info["parameters"]["forward"], "the function table names forward's parameters"
    assert "relax.VMExecutable" in [m["kind"] for m in info["embedded"]]
    text = tvmdsoop("inspect", str(models_dir / "mlp.so")).stdout
    assert "Relax model" in text and f"forward({', '.join(info['parameters']['forward'])})" in text


def test_inspect_a_legacy_library() -> None:
    info = inspect_json(LEGACY_FIXTURES / "legacy.so")
    assert info["kind"] == "legacy"
    assert info["tvm"] == "0.8-0.20"
    assert {"add_one", "row_sum", "add_pair"} <= set(info["functions"])


def test_inspect_a_relay_build_model() -> None:
    info = inspect_json(LEGACY_FIXTURES / "convnet.so")
    assert (info["kind"], info["tvm"], info["functions"]) == ("model", "0.8-0.20", ["default"])
    assert [m["kind"] for m in info["embedded"]] == ["GraphExecutorFactory"]
    assert "relay.build model" in tvmdsoop("inspect", str(LEGACY_FIXTURES / "convnet.so")).stdout


def test_inspect_names_cpu_features_this_cpu_lacks_without_loading(foreign_cpu_lib: Path) -> None:
    """A library for another CPU is described, not refused: nothing of it runs."""
    info = inspect_json(foreign_cpu_lib)
    assert info["functions"] == ["noop"]
    assert info["cpu_flags"] == ["sse2", "tvmdsoop_no_such_flag"]
    assert info["missing_cpu_flags"] == ["tvmdsoop_no_such_flag"]
    assert "this CPU lacks tvmdsoop_no_such_flag" in tvmdsoop("inspect", str(foreign_cpu_lib)).stdout


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("missing", r"^tvmdsoop inspect: the library .*missing\.so does not exist$"),
        ("directory", r"^tvmdsoop inspect: the library path .* is a directory"),
        ("not ELF", r"^tvmdsoop inspect: .*hello\.so is not a shared library \(an ELF file\): it starts with 'hell'$"),
        ("empty path", r"^tvmdsoop inspect: the library path is empty$"),
    ],
)
def test_inspect_failures_are_one_line(tmp_path: Path, case: str, pattern: str) -> None:
    (tmp_path / "hello.so").write_text("hello, world")
    path = {"missing": tmp_path / "missing.so", "directory": tmp_path, "not ELF": tmp_path / "hello.so",
            "empty path": ""}[case]
    assert_one_line_error(tvmdsoop("inspect", str(path)), 1, pattern)


# --- verify --------------------------------------------------------------------


def test_verify_a_matching_digest(testlib: str) -> None:
    digest = sha256_of(testlib)
    result = tvmdsoop("verify", testlib, "--sha256", digest.upper())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK ") and digest in result.stdout


def test_verify_another_digest_fails(testlib: str) -> None:
    result = tvmdsoop("verify", testlib, "--sha256", "0" * 64)
    assert_one_line_error(result, 1, rf"has SHA-256 {sha256_of(testlib)}, not the {'0' * 64} expected$")
    assert result.stdout == ""


def test_verify_a_missing_file_fails(tmp_path: Path) -> None:
    assert_one_line_error(tvmdsoop("verify", str(tmp_path / "missing.so"), "--sha256", "0" * 64), 1, "does not exist")


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "lib.so", "--sha256", "xyz"),  # not a SHA-256
        ("verify", "lib.so"),  # no digest
        ("inspect",),  # no library
        (),  # no command
        ("frobnicate", "lib.so"),
        ("compile", "model.keras"),  # no output
        ("compile", "model.keras", "out", "--batch-sizes", "0,2"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    result = tvmdsoop(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "usage: tvmdsoop" in result.stderr


def test_the_console_script_is_the_same_command() -> None:
    """pyproject.toml installs ``tvmdsoop`` as the function python -m tf_op runs."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"tvmdsoop": "tf_op.cli:main"}
    result = subprocess.run([sys.executable, "-c", "import sys, tf_op.cli; sys.exit(tf_op.cli.main(['--version']))"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("tvmdsoop "), result.stderr


#: A small CNN, saved as a Keras file and as a SavedModel with a named
#: signature, and its Keras logits for batches 1 and 3, in the folder given.
_SAVE_MODELS = """
import sys
import keras, numpy as np, tensorflow as tf
root = sys.argv[1]
keras.utils.set_random_seed(0)
images = keras.Input((8, 8, 3), name="images")
x = keras.layers.Conv2D(4, 3, activation="relu")(images)
x = keras.layers.GlobalAveragePooling2D()(x)
model = keras.Model(images, keras.layers.Dense(2, name="logits")(x))
model.save(f"{root}/model.keras")

class Served(tf.Module):
    def __init__(self):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32, name="images")])
    def predict(self, images):
        return {"scores": self.model(images, training=False)}

served = Served()
tf.saved_model.save(served, f"{root}/saved", signatures={"predict": served.predict})
np.savez(f"{root}/expected.npz", **{str(b): model(np.random.default_rng(b).random((b, 8, 8, 3), dtype=np.float32)).numpy()
                                    for b in (1, 3)})
"""

#: Loads the SavedModel ``compile`` wrote and checks its signature's outputs.
_SERVE = """
import sys
import numpy as np, tensorflow as tf
import tf_op
out, key, output, root = sys.argv[1:]
signature = tf.saved_model.load(out).signatures[key]
expected = np.load(f"{root}/expected.npz")
for b in (1, 3):
    got = signature(images=tf.constant(np.random.default_rng(b).random((b, 8, 8, 3), dtype=np.float32)))
    np.testing.assert_allclose(got[output].numpy(), expected[str(b)], rtol=1e-4, atol=1e-5)
print("served")
"""


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    made = subprocess.run([sys.executable, "-c", _SAVE_MODELS, str(root)], capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr
    return root


@pytest.mark.parametrize(("model", "key", "output"), [("model.keras", "serving_default", "logits"),
                                                      ("saved", "predict", "scores")])
def test_compile_writes_a_savedmodel_that_runs_tvm(saved_models: Path, tmp_path: Path, model: str, key: str,
                                                   output: str) -> None:
    out = tmp_path / "compiled"
    result = tvmdsoop("compile", str(saved_models / model), str(out), "--batch-sizes", "1,3", "--signature", key,
                      "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    libraries = re.findall(r"input shapes \[\[(\d), 8, 8, 3\]\]: (\S+) \(sha256 ([0-9a-f]{64})\)", result.stdout)
    assert sorted(b for b, _, _ in libraries) == ["1", "3"], result.stdout
    for _, library, digest in libraries:
        assert Path(library).parent == out / "assets"
        assert hashlib.sha256(Path(library).read_bytes()).hexdigest() == digest
    shutil.rmtree(tmp_path / "cache")  # the SavedModel brings its libraries
    served = subprocess.run([sys.executable, "-c", _SERVE, str(out), key, output, str(saved_models)],
                            capture_output=True, text=True, timeout=300)
    assert served.returncode == 0 and "served" in served.stdout, served.stderr


@pytest.mark.parametrize(("model", "pattern"), [
    ("missing.keras", r"missing\.keras does not exist"),
    ("expected.npz", r"expected\.npz is neither a SavedModel folder nor a Keras file"),
    (".", r"is a folder with no saved_model\.pb: not a SavedModel"),
])
def test_compile_failures_are_one_line(saved_models: Path, tmp_path: Path, model: str, pattern: str) -> None:
    result = tvmdsoop("compile", str(saved_models / model), str(tmp_path / "out"))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert re.search(r"^tvmdsoop compile: .*" + pattern, result.stderr, re.MULTILINE), result.stderr


def test_compile_names_the_signatures_a_savedmodel_has(saved_models: Path, tmp_path: Path) -> None:
    result = tvmdsoop("compile", str(saved_models / "saved"), str(tmp_path / "out"))
    assert result.returncode == 1
    assert "has no signature 'serving_default'; it has ['predict']" in result.stderr


def test_compile_refuses_to_overwrite(saved_models: Path, tmp_path: Path) -> None:
    result = tvmdsoop("compile", str(saved_models / "model.keras"), str(tmp_path))
    assert result.returncode == 1 and "exists: name a new folder" in result.stderr
