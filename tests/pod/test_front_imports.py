"""A pod's front process (gRPC, admission, the registry) imports neither torch nor the engine: those load in its
engine core process only, so the front starts in a fraction of a second and holds tens of MB, not a second GB."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "triton", "transformers", "engine.llm_engine")


@pytest.mark.parametrize("entry", ["prefill_service.__main__", "decode_service.__main__"])
def test_the_front_imports_no_engine_and_no_torch(entry: str) -> None:
    code = f"import sys, {entry}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == []
