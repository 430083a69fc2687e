"""tf_op.Module checks its path when it is made: a path that cannot be a library
is refused then, in plain words, not at the first call deep in a traced graph.
And it lists the functions of every kind of library, not only of models."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_op

LEGACY_FIXTURES = Path(__file__).resolve().parents[1] / "legacy" / "fixtures"


def test_an_empty_path_is_refused_not_the_current_directory() -> None:
    with pytest.raises(ValueError, match="^tf_op: the library path is empty$"):
        tf_op.Module("")


def test_a_missing_file_is_refused_when_made(tmp_path: Path) -> None:
    path = tmp_path / "missing.so"
    with pytest.raises(FileNotFoundError, match=f"^tf_op: the library {path} does not exist$"):
        tf_op.Module(path)


def test_a_directory_is_refused_when_made(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=f"^tf_op: the library path {tmp_path} is a directory, not a library file$"):
        tf_op.Module(tmp_path)


@pytest.mark.parametrize(
    ("contents", "begins"),
    [(b"hello, world", "it starts with 'hell'"), (b"", "it is empty"), (b"\x00\x01", r"it starts with '\\x00\\x01'")],
)
def test_a_file_that_is_not_elf_is_refused_when_made(tmp_path: Path, contents: bytes, begins: str) -> None:
    path = tmp_path / "notalib.so"
    path.write_bytes(contents)
    with pytest.raises(ValueError, match=rf"^tf_op: {path} is not a shared library \(an ELF file\): {begins}$"):
        tf_op.Module(path)


def test_an_elf_file_that_is_not_a_shared_library_is_refused_when_made(tmp_path: Path) -> None:
    """An object file is ELF, but not a library the loader could map: the op
    library's ELF reader says so, before anything of it runs."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the libraries (the op library's build needs one too)"
    (tmp_path / "f.c").write_text("int f(void) { return 1; }\n")
    subprocess.run([cc, "-c", "-fPIC", "-o", str(tmp_path / "f.o"), str(tmp_path / "f.c")], check=True)
    with pytest.raises(ValueError, match=r"f\.o is not a shared library this process can load: .*not a 64-bit shared object"):
        tf_op.Module(tmp_path / "f.o")


def test_a_library_removed_after_the_module_was_made_is_reported_by_the_op(tmp_path: Path, testlib: str) -> None:
    path = tmp_path / "lib.so"
    shutil.copy(testlib, path)
    module = tf_op.Module(path)
    path.unlink()
    with pytest.raises(tf.errors.NotFoundError, match=str(path)):
        module.func("add_one")(tf.constant([1.0]))


def test_a_pinned_digest_is_kept(testlib: str) -> None:
    module = tf_op.Module(testlib, sha256="AB" * 32)
    assert module.sha256 == "ab" * 32


def test_functions_of_a_tvm_compiled_library(testlib: str) -> None:
    module = tf_op.Module(testlib)
    functions = module.functions()
    assert {"add_one", "vector_add", "sum9", "matrix_add_one"} <= set(functions)
    assert functions == sorted(functions) and "_library_bin" not in functions
    np.testing.assert_array_equal(module.func("add_one")(tf.constant([1.0])).numpy(), [2.0])


def test_functions_of_a_tvm_ffi_library_leave_out_data(ffilib: str) -> None:
    functions = tf_op.Module(ffilib).functions()
    assert {"add_one_misaligned", "conj_complex64", "identity"} <= set(functions)
    assert "not_code" not in functions
    assert not [f for f in functions if f.startswith("_")]


def test_functions_of_a_legacy_library() -> None:
    assert tf_op.Module(LEGACY_FIXTURES / "add_one.so").functions() == ["add_one"]
