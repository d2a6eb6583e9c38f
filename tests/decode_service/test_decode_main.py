"""`python -m decode_service` as a real process: serving line, registry entry, clean exit on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
import redis

from cli.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parents[2]
POD_KEY = "pdserve:pod:decode-sub"

pytestmark = pytest.mark.timeout(120)


def _read_line(stream: IO[str] | None, timeout_s: float) -> str:
    assert stream is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0] if lines else ""


def test_serves_then_exits_0_soon_after_sigterm(tiny_model: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "decode_service",
        "--model",
        str(tiny_model),
        "--redis-url",
        redis_server.url,
        "--pod-id",
        "decode-sub",
        "--num-blocks",
        "16",
        "--heartbeat-s",
        "0.2",
    ]
    with (tmp_path / "stderr.log").open("w") as stderr:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    client = redis.Redis.from_url(redis_server.url)
    try:
        line = _read_line(process.stdout, timeout_s=90)
        assert re.fullmatch(r"pdserve decode serving on 127\.0\.0\.1:\d+\n", line), (
            line,
            (tmp_path / "stderr.log").read_text(),
        )
        assert client.exists(POD_KEY)
        process.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - start < 5
        assert not client.exists(POD_KEY)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        client.close()
    assert "drained and deregistered" in (tmp_path / "stderr.log").read_text()
