"""Helpers of the overload and cancellation fault tests: streams that report how they ended and closed-loop load
that measures goodput (their cluster and KV baseline: tests/faults/support.py)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from cli.client import build_request
from cli.cluster import LocalCluster
from common.grpc_errors import retry_delay_s
from pdserve.v1 import generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S

POD_ARGS = ("--num-blocks", "1024")
"""The overload pods' flags after the e2e pods' (short engine steps, so that a cancel takes effect within a second)."""
PROMPT = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
KV_BOUND_S = 2.0 + HEARTBEAT_S
"""A cancel frees KV on every pod within 2 s; the registry shows it within one more heartbeat."""


@dataclass(slots=True, frozen=True)
class Outcome:
    """How one Generate stream ended: its status, tokens received, seconds to its end (or to its status), and the
    RetryInfo delay of a refusal."""

    code: grpc.StatusCode
    num_tokens: int
    duration_s: float
    retry_delay_s: float | None = None


def stream(stub: generation_pb2_grpc.GenerationServiceStub, max_tokens: int, timeout_s: float = 300.0) -> Outcome:
    """One greedy Generate call of PROMPT, read to its end."""
    started = time.monotonic()
    num_tokens = 0
    try:
        for message in stub.Generate(build_request(PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
                                     timeout=timeout_s):  # fmt: skip
            num_tokens += len(message.token_ids)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        return Outcome(exc.code(), num_tokens, time.monotonic() - started, retry_delay_s(exc))
    return Outcome(grpc.StatusCode.OK, num_tokens, time.monotonic() - started)


def concurrent_streams(address: str, num_streams: int, max_tokens: int) -> list[Outcome]:
    """`num_streams` calls started at once (one thread each, one channel), each read to its end."""
    outcomes: list[Outcome] = []
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        barrier = threading.Barrier(num_streams)

        def one() -> None:
            barrier.wait()
            outcomes.append(stream(stub, max_tokens))

        threads = [threading.Thread(target=one) for _ in range(num_streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return outcomes


def cpu_s(cluster: LocalCluster) -> float:
    """CPU seconds the router and the pods (every thread of each process) have used so far."""
    processes = [*cluster.pods.values(), *([cluster.router] if cluster.router is not None else [])]
    ticks = 0
    for process in processes:
        # NOTE: fields after the command's ")": state is the 1st, utime and stime the 12th and 13th.
        fields = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True, frozen=True)
class LoadResult:
    """A closed-loop run: completed tokens per second of wall time and per CPU second of the cluster's processes
    (the measure that other load on a shared machine leaves alone), and every call's outcome."""

    goodput: float
    tokens_per_cpu_s: float
    outcomes: list[Outcome]


def closed_loop(cluster: LocalCluster, concurrency: int, max_tokens: int, duration_s: float) -> LoadResult:
    """`concurrency` clients, each sending a call after the last one ended (after its RetryInfo delay when refused)
    for `duration_s`; goodput counts the tokens of completed calls over the time until the last one ended."""
    outcomes: list[Outcome] = []
    cpu_before = cpu_s(cluster)
    with grpc.insecure_channel(cluster.router_address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        start = time.monotonic()
        end = start + duration_s

        def client() -> None:
            while time.monotonic() < end:
                outcome = stream(stub, max_tokens, timeout_s=max(end - time.monotonic(), 0.1) + 60.0)
                outcomes.append(outcome)
                if outcome.retry_delay_s is not None:
                    time.sleep(min(outcome.retry_delay_s, max(end - time.monotonic(), 0.0)))

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - start
    completed = sum(o.num_tokens for o in outcomes if o.code is grpc.StatusCode.OK)
    return LoadResult(completed / elapsed, completed / max(cpu_s(cluster) - cpu_before, 1e-3), outcomes)
