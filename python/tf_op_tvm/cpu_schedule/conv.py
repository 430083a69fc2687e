"""Schedules for convolutions (NHWC conv2d, 1x1 and larger, and depthwise)."""

from __future__ import annotations

from typing import Any


def rules(target: Any) -> list[Any]:
    return []
