"""Fault figures of today's request path over real processes on the CPU (docs/reliability.md): kill -9 a decode
pod mid-stream and a cancel storm. Not a test: it prints what happened. (The fuzz of the public API is a test now:
tests/faults/test_fuzz.py.)

Usage: .venv/bin/python scripts/fault_probe.py
"""

from __future__ import annotations

import json
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from client.generation_client import GenerationClient

PROMPT = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
POD_ARGS = ("--heartbeat-s", "0.2", "--num-blocks", "512", "--long-prefill-token-threshold", "64")


def _stream(client: GenerationClient, results: list[str], max_tokens: int) -> None:
    try:
        for _ in client.generate(prompt=PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0):
            pass
        results.append("ok")
    except grpc.RpcError as exc:
        results.append(exc.code().name)


def _idle(cluster: LocalCluster) -> bool:
    return all(p.num_free_blocks == p.num_total_blocks and p.num_running == 0 for p in cluster.pod_infos())


def _until(check: object, timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def kill_decode(cluster: LocalCluster, client: GenerationClient) -> dict[str, object]:
    results: list[str] = []
    threads = [threading.Thread(target=_stream, args=(client, results, 200)) for _ in range(12)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    decode_id = next(p for p in cluster.pod_ids if p.startswith("decode"))
    cluster.stop_pod(decode_id, signal.SIGKILL)
    killed = time.monotonic()
    probe: list[str] = []
    recovered = _until(lambda: (probe.clear(), _stream(client, probe, 4), probe == ["ok"])[2], 30.0)
    for thread in threads:
        thread.join()
    return {
        "streams": 12,
        "outcomes": dict(Counter(results)),
        "new_request_ok_after_s": recovered,
        "kill_to_join_s": round(time.monotonic() - killed, 1),
    }


def cancel_storm(cluster: LocalCluster, client: GenerationClient) -> dict[str, object]:
    rng = random.Random(0)

    def one() -> None:
        stream = client.generate(prompt=PROMPT, max_tokens=200, ignore_eos=True, temperature=0.0)
        try:
            for _ in range(rng.randint(0, 20)):
                next(stream)
        except (grpc.RpcError, StopIteration):
            pass
        stream.close()

    threads = [threading.Thread(target=one) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = time.monotonic()
    back = _until(lambda: _idle(cluster), 30.0)
    return {
        "streams_cancelled": 100,
        "kv_back_to_baseline_s": None if back is None else round(back, 2),
        "after_last_cancel_s": round(time.monotonic() - done, 2),
    }


def main() -> None:
    config = ClusterConfig(
        num_prefill=1,
        num_decode=2,
        port=0,
        registry_refresh_s=0.2,
        pod_args=POD_ARGS,
        log_dir=Path(tempfile.mkdtemp()),
        metrics_port=None,
    )
    with LocalCluster(config) as cluster, GenerationClient(cluster.router_address) as client:
        report = {"kill -9 decode mid-stream (1P+2D)": kill_decode(cluster, client)}
        cluster.add_pod("decode")
        _until(lambda: _idle(cluster), 30.0)
        report["cancel storm"] = cancel_storm(cluster, client)
        probe: list[str] = []
        _stream(client, probe, 8)
        report["serves afterwards"] = probe
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
