"""One variant of a kernel sweep, timed into a row: its time and bandwidth or throughput, or the error it raised."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def sweep_row(name: str, fn: Callable[[], float], nbytes: int = 0, flops: float = 0) -> dict[str, Any]:
    """Times one variant; a shape that does not fit (e.g. shared memory) is recorded as an error."""
    try:
        ms = fn()
    except Exception as error:
        row: dict[str, Any] = {"name": name, "error": f"{type(error).__name__}: {str(error)[:200]}"}
    else:
        row = {"name": name, "us": ms * 1e3}
        row |= {"gb_s": nbytes / ms / 1e6} if nbytes else {}
        row |= {"tflop_s": flops / ms / 1e9} if flops else {}
    print(json.dumps(row))
    return row
