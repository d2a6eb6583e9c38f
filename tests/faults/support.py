"""Helpers of every fault test: a cluster of real processes, streams on threads whose progress a test watches while
it breaks something, and the checks every fault scenario makes (KV back to baseline, a fresh request served).
input_support.py (hostile input) and overload_support.py (load and refusals) add what only their tests need.

Faults are real signals to real processes (kill -9, SIGSTOP/SIGCONT); nothing is mocked.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.pod_registry import PodInfo, PodRole
from pdserve.v1 import generation_pb2
from tests.e2e.support import cluster_config

STREAM_TIMEOUT_S = 900.0
"""Bound on one stream (the soak variants on a loaded 2-core machine included); pytest's timeout bounds each test."""
SOAK_TIMEOUT_S = 1800
"""pytest timeout of a soak variant."""


@contextmanager
def fault_cluster(
    log_dir: Path,
    num_prefill: int = 1,
    num_decode: int = 1,
    pod_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
) -> Iterator[LocalCluster]:
    """Redis, the pods (the e2e tests' flags, then `pod_args`: a flag given again overrides) and a router started
    with `router_args`, as real processes, stopped afterwards."""
    config = cluster_config(
        log_dir, *pod_args, num_prefill=num_prefill, num_decode=num_decode, router_args=tuple(router_args)
    )
    with LocalCluster(config) as cluster:
        yield cluster


@dataclass(slots=True)
class Stream:
    """One Generate call (`request`: GenerationClient.generate's kwargs) read on a thread of its own."""

    request: Mapping[str, Any]
    token_ids: list[int] = field(default_factory=list)
    metrics: generation_pb2.RequestMetrics | None = None
    error: grpc.RpcError | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def start(self, client: GenerationClient) -> Stream:
        threading.Thread(target=self._run, args=(client,), daemon=True).start()
        return self

    def _run(self, client: GenerationClient) -> None:
        try:
            for response in client.generate(timeout_s=STREAM_TIMEOUT_S, **self.request):
                self.token_ids.extend(response.token_ids)
                if response.HasField("metrics"):
                    self.metrics = response.metrics
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.finished.set()

    @property
    def num_attempts(self) -> int:
        return 0 if self.metrics is None else self.metrics.num_attempts


def start_streams(client: GenerationClient, requests: Sequence[Mapping[str, Any]]) -> list[Stream]:
    return [Stream(request).start(client) for request in requests]


def join_streams(streams: Sequence[Stream], timeout_s: float = STREAM_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    for stream in streams:
        assert stream.finished.wait(max(deadline - time.monotonic(), 0.0)), f"stream {stream.request} hangs"


def seconds_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> float | None:
    """How long until `condition` holds (polled); None when it does not within `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(interval_s)
    return None


def pods_of(cluster: LocalCluster, role: PodRole) -> list[PodInfo]:
    """The registry's live pods of `role`."""
    return [pod for pod in cluster.pod_infos() if pod.role == role]


def kv_at_baseline(cluster: LocalCluster, role: PodRole | None = None) -> bool:
    """Every live pod (of `role`, when given) holds no KV block and runs or queues no request (its last heartbeat
    says so)."""
    pods = cluster.pod_infos() if role is None else pods_of(cluster, role)
    return bool(pods) and all(
        p.num_free_blocks == p.num_total_blocks and p.num_running == 0 and p.num_waiting == 0 for p in pods
    )


def seconds_to_serve(client: GenerationClient, prompt: Sequence[int], timeout_s: float) -> float | None:
    """How long until a fresh 2-token greedy request succeeds (retried at once on failure); None if none did."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            for _ in client.generate(token_ids=prompt, max_tokens=2, temperature=0.0, timeout_s=timeout_s):
                pass
        except grpc.RpcError:
            continue
        return time.monotonic() - start
    return None


def kill(cluster: LocalCluster, pod_id: str) -> float:
    """kill -9 the pod; the time.monotonic() of the kill."""
    cluster.stop_pod(pod_id, signal.SIGKILL)
    return time.monotonic()


def log_errors(cluster: LocalCluster, markers: Sequence[str] = ("Traceback",)) -> dict[str, str]:
    """The process logs that show any of `markers`: each one's name and its text around the first one."""
    found = {}
    for path in sorted(cluster.log_dir.glob("*.log")):
        text = path.read_text(errors="replace")
        at = min((i for marker in markers if (i := text.find(marker)) >= 0), default=-1)
        if at >= 0:
            found[path.name] = text[max(at - 300, 0) : at + 3000]
    return found


def random_prompt(seed: int, num_tokens: int) -> list[int]:
    """Token ids drawn from ordinary vocabulary, different for each seed."""
    rng = random.Random(seed)
    return [rng.randrange(1_000, 30_000) for _ in range(num_tokens)]
