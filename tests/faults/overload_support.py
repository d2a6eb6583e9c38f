"""Helpers of the overload and cancellation fault tests: streams that report how they ended and closed-loop load
that measures goodput (their cluster and KV baseline: tests/faults/support.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from cli.client import build_request
from cli.cluster import LocalCluster
from common.grpc_errors import retry_delay_s
from pdserve.v1 import generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S
from tests.faults.support import STREAM_TIMEOUT_S

POD_ARGS = ("--num-blocks", "1024")
"""The overload pods' flags after the e2e pods' (short engine steps, so that a cancel takes effect within a second)."""
PROMPT = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
KV_BOUND_S = 2.0 + HEARTBEAT_S
"""A cancel frees KV on every pod within 2 s; the registry shows it within one more heartbeat."""
CLIENT_START_S = 3.0
"""How long after `concurrent_streams` is called its client processes send their calls, all at once (they start,
import gRPC and connect meanwhile)."""


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


def concurrent_streams(address: str, num_streams: int, max_tokens: int, num_processes: int = 1) -> list[Outcome]:
    """`num_streams` greedy calls of PROMPT sent at once, each read to its end, from `num_processes` client processes
    (each an asyncio loop with its own channel, so that the client is not what the calls wait for); each call's
    `duration_s` runs from its send to its status."""
    start_at = time.time() + CLIENT_START_S
    shares = [num_streams // num_processes + (i < num_streams % num_processes) for i in range(num_processes)]
    with ProcessPoolExecutor(num_processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = pool.map(_client_process, [address] * num_processes, shares, [max_tokens] * num_processes,
                         [start_at] * num_processes)  # fmt: skip
        return [outcome for part in parts for outcome in part]


def _client_process(address: str, num_streams: int, max_tokens: int, start_at: float) -> list[Outcome]:
    return asyncio.run(_client_calls(address, num_streams, max_tokens, start_at))


async def _client_calls(address: str, num_streams: int, max_tokens: int, start_at: float) -> list[Outcome]:
    request = build_request(PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        await channel.channel_ready()

        async def one() -> Outcome:
            started = time.monotonic()
            num_tokens = 0
            try:
                async for message in stub.Generate(request, timeout=STREAM_TIMEOUT_S):
                    num_tokens += len(message.token_ids)
            except grpc.aio.AioRpcError as exc:
                return Outcome(exc.code(), num_tokens, time.monotonic() - started, retry_delay_s(exc))
            return Outcome(grpc.StatusCode.OK, num_tokens, time.monotonic() - started)

        await asyncio.sleep(max(start_at - time.time(), 0.0))
        return await asyncio.gather(*(one() for _ in range(num_streams)))


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
