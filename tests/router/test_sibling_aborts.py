"""Abort across a router's processes: the answers' merge, exactly, and the fan-out over real gRPC servers on Unix
sockets, as the processes of `pdserve router --workers N` run it (router.processes.sibling_aborts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest

from common.auth import AuthInterceptor, TokenAuthenticator, bearer_metadata
from common.grpc.errors import ErrorInterceptor
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.completion.running_requests import AbortResult, RunningRequests, merge_aborts
from router.processes.router_process import RouterProcess
from router.processes.sibling_aborts import FORWARDED_KEY, SiblingAborts
from router.server import GenerationServicer
from router.server_status import ServerStatus

NUM_PROCESSES = 3
TOKEN = "secret-token"
ABORTED, FINISHED, NOT_FOUND = AbortResult.ABORTED, AbortResult.ALREADY_FINISHED, AbortResult.NOT_FOUND


@pytest.mark.parametrize(
    ("answers", "merged"),
    [
        ([(NOT_FOUND, 0), (ABORTED, 2), (FINISHED, 0), (ABORTED, 1)], (ABORTED, 3)),
        ([(NOT_FOUND, 0), (FINISHED, 0), (NOT_FOUND, 0)], (FINISHED, 0)),
        ([(NOT_FOUND, 0), (NOT_FOUND, 0)], (NOT_FOUND, 0)),
        ([(ABORTED, 1)], (ABORTED, 1)),
    ],
)
def test_answers_merge_aborted_first_then_finished_then_not_found(
    answers: list[tuple[AbortResult, int]], merged: tuple[AbortResult, int]
) -> None:
    assert merge_aborts(answers) == merged


@pytest.mark.anyio
async def test_running_requests_report_their_count_at_every_change() -> None:
    counts: list[int] = []
    running = RunningRequests(on_count=counts.append)
    release = asyncio.Event()

    async def hold(request_id: str) -> None:
        with running.running(request_id):
            await release.wait()

    tasks = [asyncio.create_task(hold(rid)) for rid in ("a", "a", "b")]
    await asyncio.sleep(0)
    assert (counts, len(running)) == ([1, 2, 3], 3)
    assert running.abort("a") == (ABORTED, 2)
    await asyncio.gather(*tasks[:2], return_exceptions=True)
    release.set()
    await tasks[2]
    assert (counts, len(running)) == ([1, 2, 3, 2, 1, 0], 0)


class _Processes:
    """NUM_PROCESSES servicers, each on its own gRPC server and Unix socket, bearer tokens required, each with the
    others as siblings: the router's processes as far as Abort goes."""

    def __init__(self, run_dir: Path) -> None:
        self.layouts = [RouterProcess(i, NUM_PROCESSES, run_dir) for i in range(NUM_PROCESSES)]
        self.running = [RunningRequests() for _ in self.layouts]
        self.siblings = [SiblingAborts(layout.sibling_addresses()) for layout in self.layouts]
        self.servers: list[grpc.aio.Server] = []
        for layout, running, siblings in zip(self.layouts, self.running, self.siblings, strict=True):
            lifecycle: Any = SimpleNamespace(running=running)
            server = grpc.aio.server(interceptors=[AuthInterceptor(TokenAuthenticator([TOKEN])), ErrorInterceptor()])
            servicer = GenerationServicer(lifecycle, status=ServerStatus(list, 0), siblings=siblings)
            generation_pb2_grpc.add_GenerationServiceServicer_to_server(servicer, server)
            server.add_insecure_port(layout.address())
            self.servers.append(server)

    async def abort(self, process: int, request_id: str, forwarded: bool = False) -> tuple[int, int]:
        metadata = [*bearer_metadata(TOKEN), *([(FORWARDED_KEY, "1")] if forwarded else [])]
        async with grpc.aio.insecure_channel(self.layouts[process].address()) as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            reply = await stub.Abort(generation_pb2.AbortRequest(request_id=request_id), metadata=metadata, timeout=5)
        return reply.result, reply.num_aborted

    async def aclose(self) -> None:
        await asyncio.gather(*(server.stop(None) for server in self.servers))
        await asyncio.gather(*(siblings.aclose() for siblings in self.siblings))


@pytest.fixture(scope="module", autouse=True)
async def one_event_loop(anyio_backend: str) -> AsyncIterator[None]:
    """Every test of the module on one event loop. grpc.aio binds each loop it meets to its completion queue: an event
    of one test's calls that arrives after that test's loop closed is handled by the next test's loop, which fails
    with 'Event loop is closed' (seen once at this module's setup under load)."""
    yield


@pytest.fixture
async def processes(tmp_path: Path) -> AsyncIterator[_Processes]:
    group = _Processes(tmp_path)
    await asyncio.gather(*(server.start() for server in group.servers))
    yield group
    await group.aclose()


async def _run(running: RunningRequests, request_id: str, started: asyncio.Event) -> None:
    with running.running(request_id):
        started.set()
        await asyncio.sleep(60)


@pytest.mark.anyio
async def test_an_abort_reaching_any_process_cancels_the_request_wherever_it_runs(processes: _Processes) -> None:
    for caller in range(NUM_PROCESSES):
        request_id = f"request-{caller}"
        holders = [p for p in range(NUM_PROCESSES) if p != caller]
        started = [asyncio.Event() for _ in holders]
        tasks = [
            asyncio.create_task(_run(processes.running[p], request_id, e))
            for p, e in zip(holders, started, strict=True)
        ]
        await asyncio.gather(*(event.wait() for event in started))
        assert await processes.abort(caller, request_id) == (generation_pb2.ABORT_RESULT_ABORTED, 2)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(result, asyncio.CancelledError) for result in results)
        assert await processes.abort(caller, request_id) == (generation_pb2.ABORT_RESULT_ALREADY_FINISHED, 0)
    assert await processes.abort(0, "unknown") == (generation_pb2.ABORT_RESULT_NOT_FOUND, 0)


@pytest.mark.anyio
async def test_a_forwarded_abort_is_answered_from_the_process_own_requests_only(processes: _Processes) -> None:
    started = asyncio.Event()
    task = asyncio.create_task(_run(processes.running[2], "held-by-2", started))
    await started.wait()
    assert await processes.abort(0, "held-by-2", forwarded=True) == (generation_pb2.ABORT_RESULT_NOT_FOUND, 0)
    assert not task.done()
    assert await processes.abort(2, "held-by-2", forwarded=True) == (generation_pb2.ABORT_RESULT_ABORTED, 1)
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.anyio
async def test_a_sibling_that_is_gone_counts_as_not_found_and_the_others_still_answer(
    processes: _Processes, tmp_path: Path
) -> None:
    await processes.servers[1].stop(None)
    started = asyncio.Event()
    task = asyncio.create_task(_run(processes.running[2], "held-by-2", started))
    await started.wait()
    sent = time.monotonic()
    assert await processes.abort(0, "held-by-2") == (generation_pb2.ABORT_RESULT_ABORTED, 1)
    assert time.monotonic() - sent < 1.0
    with pytest.raises(asyncio.CancelledError):
        await task
    gone = SiblingAborts([f"unix:{tmp_path / 'never-bound.sock'}"])
    assert await gone.abort("x", []) == [(NOT_FOUND, 0)]
    await gone.aclose()
