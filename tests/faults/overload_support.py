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

import grpc

from bench.online.process_cpu import CpuSnapshot
from cli.cluster import LocalCluster
from client.generation_client import build_request
from common.child_process import die_with_parent
from common.grpc.errors import retry_delay_s
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S
from tests.faults.support import STREAM_TIMEOUT_S

POD_ARGS = ("--num-blocks", "1024")
"""The overload pods' flags after the e2e pods' (short engine steps, so that a cancel takes effect within a second)."""
PROMPT = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
KV_BOUND_S = 2.0 + HEARTBEAT_S
"""A cancel frees KV on every pod within 2 s; the registry shows it within one more heartbeat."""
CLIENT_START_S = 3.0
"""How long after `concurrent_streams` or `closed_loop` is called their client processes send their first calls, all
at once (they start, import gRPC and connect meanwhile)."""


@dataclass(slots=True, frozen=True)
class Outcome:
    """How one Generate stream ended: its status, tokens received, seconds to its end (or to its status), and the
    RetryInfo delay of a refusal."""

    code: grpc.StatusCode
    num_tokens: int
    duration_s: float
    retry_delay_s: float | None = None


def concurrent_streams(address: str, num_streams: int, max_tokens: int, num_processes: int = 1) -> list[Outcome]:
    """`num_streams` greedy calls of PROMPT sent at once from `num_processes` client processes (see `_burst_process`),
    each read to its end; each call's `duration_s` runs from its send to its status."""
    start_at = time.time() + CLIENT_START_S
    with _client_pool(num_processes) as pool:
        shares = _shares(num_streams, num_processes)
        parts = [pool.submit(_burst_process, address, n, max_tokens, start_at) for n in shares]
        return [outcome for part in parts for outcome in part.result()]


def _burst_process(address: str, num_calls: int, max_tokens: int, start_at: float) -> list[Outcome]:
    """One client process of a burst: at `start_at` (time.time()) it sends its `num_calls` calls back to back on one
    channel of gRPC's synchronous API, each timed from its send to its status by a done callback (run on the
    channel's thread as the status arrives), then reads them in order. The synchronous API, not grpc.aio: a call sent
    costs the client process a third of the CPU (300 calls from 4 processes on the 2-core machine: refusals ended
    31-74 ms after their send against 74-161 ms), and the client's CPU is what the router needs to answer the burst.
    A completed call's status arrives once its messages are read, so its time includes the calls read before it."""
    request = build_request(PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=STREAM_TIMEOUT_S)
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        time.sleep(max(start_at - time.time(), 0.0))
        calls = [_TimedCall(stub, request) for _ in range(num_calls)]
        return [call.outcome() for call in calls]


class _TimedCall:
    """A Generate call sent at once, whose status time a done callback notes."""

    def __init__(self, stub: generation_pb2_grpc.GenerationServiceStub, request: generation_pb2.GenerateRequest):
        self._sent = time.monotonic()
        self._ended = 0.0
        self._done = threading.Event()
        self._call = stub.Generate(request, timeout=STREAM_TIMEOUT_S)
        self._call.add_done_callback(self._note_end)

    def _note_end(self, _: object) -> None:
        self._ended = time.monotonic()
        self._done.set()

    def outcome(self) -> Outcome:
        """Reads the call's messages to its end: how it ended."""
        num_tokens, code, delay = 0, grpc.StatusCode.OK, None
        try:
            for message in self._call:
                num_tokens += len(message.token_ids)
        except grpc.RpcError as exc:
            assert isinstance(exc, grpc.Call)
            code, delay = exc.code(), retry_delay_s(exc)
        if not self._done.wait(STREAM_TIMEOUT_S):
            raise TimeoutError("a Generate call ended but its done callback never ran")
        return Outcome(code, num_tokens, self._ended - self._sent, delay)


def cpu_s(cluster: LocalCluster) -> float:
    """CPU seconds the router and the pods have used so far, each with its live descendants (the pods' engine
    cores, the router's tokenizer workers and processes): every thread of each."""
    processes = [*cluster.pods.values(), *([cluster.router] if cluster.router is not None else [])]
    snapshot = CpuSnapshot.take()
    return sum(snapshot.tree(process.pid) for process in processes)


@dataclass(slots=True, frozen=True)
class LoadResult:
    """A closed-loop run: completed tokens per second of wall time and per CPU second of the cluster's processes
    (the measure that other load on a shared machine leaves alone), and every call's outcome."""

    goodput: float
    tokens_per_cpu_s: float
    outcomes: list[Outcome]


def closed_loop(
    cluster: LocalCluster, concurrency: int, max_tokens: int, duration_s: float, num_processes: int = 4
) -> LoadResult:
    """`concurrency` clients over `num_processes` client processes, each client sending a call after its last one
    ended (after its RetryInfo delay when refused) for `duration_s`; goodput counts the tokens of completed calls over
    the time until the last one ended."""
    start_at = time.time() + CLIENT_START_S
    with _client_pool(num_processes) as pool:
        parts = [
            pool.submit(_client_process, cluster.router_address, n, max_tokens, start_at, duration_s)
            for n in _shares(concurrency, num_processes)
        ]
        time.sleep(max(start_at - time.time(), 0.0))
        cpu_before = cpu_s(cluster)
        results = [part.result() for part in parts]
    outcomes = [outcome for part, _ in results for outcome in part]
    elapsed = max(last for _, last in results) - start_at
    completed = sum(o.num_tokens for o in outcomes if o.code is grpc.StatusCode.OK)
    return LoadResult(completed / elapsed, completed / max(cpu_s(cluster) - cpu_before, 1e-3), outcomes)


def _client_pool(num_processes: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(num_processes, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))


def _shares(num_calls: int, num_processes: int) -> list[int]:
    """`num_calls` spread over at most `num_processes` processes, none with nothing to do."""
    shares = [num_calls // num_processes + (i < num_calls % num_processes) for i in range(num_processes)]
    return [n for n in shares if n]


def _client_process(
    address: str, num_clients: int, max_tokens: int, start_at: float, duration_s: float
) -> tuple[list[Outcome], float]:
    """One client process: an asyncio loop with its own channel (so that the client is not what the calls wait for)
    whose `num_clients` clients each send their first call at `start_at` (time.time()), then, for `duration_s`, the
    next once the last ended; every call's outcome, and the time.time() when the last one ended."""
    return asyncio.run(_clients(address, num_clients, max_tokens, start_at, duration_s))


async def _clients(
    address: str, num_clients: int, max_tokens: int, start_at: float, duration_s: float
) -> tuple[list[Outcome], float]:
    request = build_request(PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        await channel.channel_ready()
        await asyncio.sleep(max(start_at - time.time(), 0.0))
        end = time.monotonic() + duration_s

        async def client() -> list[Outcome]:
            outcomes: list[Outcome] = []
            while not outcomes or time.monotonic() < end:
                outcomes.append(await _call(stub, request))
                if outcomes[-1].retry_delay_s is not None:
                    await asyncio.sleep(min(outcomes[-1].retry_delay_s, max(end - time.monotonic(), 0.0)))
            return outcomes

        parts = await asyncio.gather(*(client() for _ in range(num_clients)))
    return [outcome for part in parts for outcome in part], time.time()


async def _call(stub: generation_pb2_grpc.GenerationServiceStub, request: generation_pb2.GenerateRequest) -> Outcome:
    """One call, read to its end: its outcome, timed from its send to its status."""
    started = time.monotonic()
    num_tokens = 0
    try:
        async for message in stub.Generate(request, timeout=STREAM_TIMEOUT_S):
            num_tokens += len(message.token_ids)
    except grpc.aio.AioRpcError as exc:
        return Outcome(exc.code(), num_tokens, time.monotonic() - started, retry_delay_s(exc))
    return Outcome(grpc.StatusCode.OK, num_tokens, time.monotonic() - started)
