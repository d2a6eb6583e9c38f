"""Runs Triton kernel checks on the CPU: in a child process under TRITON_INTERPRET=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(module: str, function: str, timeout_s: float = 120) -> None:
    """Call `module.function()` in Triton's interpreter; fail with the child's stderr if it raises.

    NOTE: a fresh process, since TRITON_INTERPRET only takes effect if set before triton is first imported.
    """
    result = subprocess.run(
        [sys.executable, "-c", f"from {module} import {function}; {function}()"],
        cwd=REPO_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
