"""What tf_op.compile tells the user: stage lines once a compile is slow
(tf_op/compiler/progress.py), and, when TVM's Python lacks a module, the extra
that brings it."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

import tf_op
from tf_op.compiler import worker
from tf_op.compiler.progress import Progress


def test_a_quick_compile_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("quick", after_s=5.0, stream=out) as progress:
        progress.stage("traced")
    assert out.getvalue() == ""


def test_a_slow_compile_prints_its_stages_the_earlier_first() -> None:
    out = io.StringIO()
    with Progress("slow", after_s=0.2, stream=out) as progress:
        progress.stage("traced in 0.01 s")
        assert out.getvalue() == ""
        deadline = time.monotonic() + 10
        while "traced" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        progress.stage("converted to TFLite")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("tf_op.compile(slow)") and lines[0].endswith(": traced in 0.01 s")
    assert lines[1].endswith(": converted to TFLite")


@pytest.mark.parametrize(("setting", "printed"), [("1", True), ("0", False)])
def test_the_environment_says_whether_to_print(monkeypatch: pytest.MonkeyPatch, setting: str, printed: bool) -> None:
    monkeypatch.setenv("TVMDSOOP_PROGRESS", setting)
    out = io.StringIO()
    with Progress("any", stream=out) as progress:
        progress.stage("traced")
    assert ("traced" in out.getvalue()) == printed


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with no packages: no TVM, no tflite."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.mark.parametrize(("module", "extra"), [("tflite", "compile"), ("tvm", "compile"), ("xgboost", "tune")])
def test_a_missing_module_is_named_with_its_extra(bare_python: str, module: str, extra: str) -> None:
    failed = subprocess.run([bare_python, "-c", f"import {module}"], capture_output=True, text=True)
    assert failed.returncode != 0
    assert worker.missing_module("Traceback ...\n" + failed.stderr) == (module, extra)


def test_another_failure_names_no_extra() -> None:
    assert worker.missing_module("ValueError: Relax does not support the op FlexUnique") is None
    assert worker.missing_module("No module named 'numpy_extras'") is None


def test_compile_without_tvm_names_the_extra(monkeypatch: pytest.MonkeyPatch, bare_python: str,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("TVMDSOOP_TVM_PYTHON", bare_python)
    compiled = tf_op.compile(lambda x: x * 2.0, input_signature=[tf.TensorSpec([2], tf.float32)],
                             cache_dir=tmp_path)
    with pytest.raises(tf_op.CompileError, match=r"has no apache-tvm: install tvmdsoop's \[compile\] extra"):
        compiled(tf.ones([2]))


def test_an_eager_call_of_a_new_shape_warns_once(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    compiled = tf_op.compile(lambda x: x * 2.0, input_signature=[tf.TensorSpec([None], tf.float32)],
                             cache_dir=tmp_path)
    with caplog.at_level("WARNING", logger="tf_op.compiler"):
        for n in (2, 2, 3, 3):
            assert compiled(tf.ones([n])).numpy().tolist() == [2.0] * n
    warned = [r.getMessage() for r in caplog.records if "compiling again" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "for the new input shapes [[3]] (compiled: [[2]])" in warned[0]


def test_compile_warns_of_no_call_the_user_did_not_make(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """TF's converter calls its path deprecated: tf_op.compile takes it on purpose."""
    compiled = tf_op.compile(lambda x: tf.nn.relu(x) * 2.0, input_signature=[tf.TensorSpec([4], tf.float32)],
                             cache_dir=tmp_path)
    with caplog.at_level("WARNING"):
        assert compiled(tf.ones([4])).numpy().tolist() == [2.0] * 4
    assert not [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_a_long_stage_says_it_is_still_at_it() -> None:
    out = io.StringIO()
    with Progress("long", after_s=0, stream=out, heartbeat_s=0.3) as progress:
        progress.stage("imported the TFLite model into Relax in 1.00 s")
        deadline = time.monotonic() + 10
        while "still at it" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "still at it (the last stage: imported the TFLite model into Relax in 1.00 s)" in out.getvalue()


class _Terminal(io.StringIO):
    """What a terminal is to tqdm: a stream that says it is one."""

    def isatty(self) -> bool:
        return True


def test_tuning_trials_move_a_bar_on_a_terminal() -> None:
    pytest.importorskip("tqdm", reason="the bar is tqdm's (the tune extra, requirements/test.txt)")
    out = _Terminal()
    with Progress("tuned", after_s=0, stream=out) as progress:
        for measured in (16, 48, 64):
            progress.stage(f"tuning: {measured} of 64 trials built (2.0 s)")
        progress.stage("tuned 2 of 2 kernels in 9.00 s")
    text = out.getvalue()
    assert "tf_op.compile(tuned) tuning" in text and "64/64" in text, text
    assert "trials built" not in text, "the bar stands for the trial lines"
    assert text.rstrip().endswith(": tuned 2 of 2 kernels in 9.00 s")


def test_tuning_trials_are_lines_elsewhere() -> None:
    out = io.StringIO()
    with Progress("tuned", after_s=0, stream=out) as progress:
        progress.stage("tuning: 16 of 64 trials built (2.0 s)")
    assert out.getvalue().rstrip().endswith(": tuning: 16 of 64 trials built (2.0 s)")


_LINKER_CHECK = """
import sys
from pathlib import Path
from tf_op_tvm import compile_model
try:
    compile_model.ensure_linker(Path(sys.argv[1]))
except compile_model.NoLinkerError as e:
    print(e)
"""


def test_no_compiler_to_link_with_says_what_to_install(tmp_path: Path) -> None:
    """The TVM process with nothing on PATH: TVM would fail on a None path."""
    from conftest import TVM_PYTHON

    has_zig = subprocess.run([TVM_PYTHON, "-c", "import ziglang"], capture_output=True).returncode == 0
    if has_zig:
        pytest.skip("ziglang is installed: it links (packaging/check_wheel.sh checks that path)")
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(Path(tf_op.__file__).resolve().parents[1])}
    result = subprocess.run([TVM_PYTHON, "-c", _LINKER_CHECK, str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "none is on PATH (g++, clang++, cc or $CXX): install one, or tvmdsoop's [compile] extra" in result.stdout
