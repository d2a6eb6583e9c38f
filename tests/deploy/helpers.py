"""Shared pieces of the deployment files' tests (tests/deploy): the repository root, the CLI tools they run, and
duration and flag parsing. The tools (docker-compose, kubectl) come from scripts/setup.sh; without one a test
skips locally and fails under CI (CI=true), so a missing install step cannot pass unnoticed."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from pod.config import PodServerConfig

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DRAIN_TIMEOUT_S = PodServerConfig().drain_timeout_s
"""The pods' --drain-timeout-s default; the router also gives in-flight calls 30 s (router/__main__.py)."""
ROUTER_DRAIN_S = 30.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def require_tool(name: str) -> str:
    """The path of the command `name`; skips without it, except under CI, where it fails."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (scripts/setup.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def duration_s(value: str | int | float) -> float:
    """A compose duration ("45s", "1m30s", "10m") or a number of seconds, in seconds."""
    if isinstance(value, int | float):
        return float(value)
    parts = _DURATION_PART.findall(value)
    assert parts and "".join(n + u for n, u in parts) == value, f"not a duration: {value!r}"
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag=value` or `--flag value` in `args`; None when absent."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag:
            return args[i + 1]
    return None
