"""What ``tf_op.compile`` raises when a function cannot be compiled."""

from __future__ import annotations


class CompileError(RuntimeError):
    """TF's TFLite converter or TVM could not compile the function; the message
    holds their reason (the unsupported ops, the worker's stderr tail)."""
