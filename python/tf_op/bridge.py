"""Kept for existing imports (``from tf_op.bridge import CompileError``): the
compiler is the package ``tf_op.compiler``, whose public names these are."""

from tf_op.compiler import (
    DEFAULT_TARGET,
    DEFAULT_TUNING_TRIALS,
    HOST_TARGET,
    CompiledFunction,
    CompileError,
    Shapes,
    Target,
    compile,  # noqa: A004
)
from tf_op.compiler.cache import FORMAT_VERSION

__all__ = [
    "DEFAULT_TARGET", "DEFAULT_TUNING_TRIALS", "FORMAT_VERSION", "HOST_TARGET", "CompileError", "CompiledFunction",
    "Shapes", "Target", "compile",
]
