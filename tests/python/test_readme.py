"""The README's snippets run as written: its build script compiles a library with
TVM (in a process of its own, as the README says), and its Python snippet runs
that library in TensorFlow, each `expr  # -> value` line checked against value."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

from helpers import run_python

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(f"\n{heading}\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _checks(block: str) -> list[tuple[str, str]]:
    """(expression, expected literal) of each `expr  # -> value` line."""
    return [
        (m.group(1).strip(), m.group(2).strip().replace("., ", ".0, ").replace(".]", ".0]"))
        for m in re.finditer(r"^(.*?)#\s*->\s*(\[.*\])\s*$", block, re.M)
    ]


def test_readme_build_and_python_snippets(tmp_path: Path) -> None:
    build = run_python(_python_block_after("## Build your own TVM library"), cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "mylib.so").is_file()

    block = _python_block_after("## Python")
    checks = _checks(block)
    assert len(checks) >= 2, "the snippet shows its results"
    script = block + "\nimport json\nprint(json.dumps([(" + ").numpy().tolist(), (".join(e for e, _ in checks) + ").numpy().tolist()]))\n"
    run = run_python(script, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    results = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    for (expr, expected), got in zip(checks, results, strict=True):
        np.testing.assert_array_equal(got, ast.literal_eval(expected), err_msg=expr)
