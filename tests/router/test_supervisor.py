"""`pdserve router --workers 2` as real processes, without pods (Redis unreachable: the router serves regardless):
one free port for both workers, the serving line once both serve, connections spread over both, SIGTERM ends every
process and the run folder; a worker that cannot serve stops everything with exit 1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.v1 import generation_pb2, generation_pb2_grpc
from tests.e2e.support import channels_to_each_worker, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 60.0


def _router(out: Path, *args: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "router", "--workers", "2", "--redis-url", "redis://127.0.0.1:1/0", *args]
    with out.open("wb") as stdout:
        return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=stdout, stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
def test_two_workers_share_a_free_port_and_sigterm_stops_them_all(tmp_path: Path) -> None:
    out = tmp_path / "router.log"
    router = _router(out, "--port", "0")
    try:
        assert wait_until(lambda: "pdserve router serving on" in out.read_text(), START_TIMEOUT_S), out.read_text()
        [line] = [line for line in out.read_text().splitlines() if line.startswith("pdserve router serving on")]
        address = line.removeprefix("pdserve router serving on ")
        workers = _children(router.pid)
        run_dir = Path(Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")[3].decode())
        assert len(workers) == 2 and run_dir.is_dir()
        channels = channels_to_each_worker(address, 2)
        assert sorted(channels) == [0, 1]
        for channel in channels.values():
            info = generation_pb2_grpc.GenerationServiceStub(channel).GetServerInfo(
                generation_pb2.GetServerInfoRequest(), timeout=10
            )
            assert (info.num_router_workers, info.tokenizer_pool_size) == (2, 2)
            channel.close()
        router.send_signal(signal.SIGTERM)
        assert router.wait(EXIT_TIMEOUT_S) == 0
        assert not any(_alive(pid) for pid in workers)
        assert not run_dir.exists()
    finally:
        router.kill()
        router.wait()


@pytest.mark.slow
def test_a_worker_that_cannot_serve_stops_the_router_with_exit_1(tmp_path: Path) -> None:
    out = tmp_path / "router.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        router = _router(out, "--port", str(taken.getsockname()[1]))
        try:
            assert router.wait(START_TIMEOUT_S) == 1
        finally:
            router.kill()
            router.wait()
    log = out.read_text()
    assert "before serving" in log and "pdserve router serving on" not in log, log
