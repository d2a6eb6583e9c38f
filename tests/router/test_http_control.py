"""The control RPCs' answers, exactly: GetServerInfo and GetLoad from a ServerStatus, Abort from RunningRequests."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from common.pod_registry import PodInfo
from pdserve.v1 import generation_pb2
from router.completion.running_requests import RunningRequests
from router.model_info import ModelInfo
from router.server import GenerationServicer
from router.server_status import ServerStatus

PODS = [
    PodInfo(
        "decode-0",
        "decode",
        "127.0.0.1:2",
        "m",
        7,
        draining=True,
        num_running=1,
        num_free_blocks=10,
        num_total_blocks=16,
        tensor_parallel_size=2,
    ),
    PodInfo("prefill-0", "prefill", "127.0.0.1:1", "m", 5, num_waiting=2),
]


def _servicer(status: ServerStatus) -> tuple[GenerationServicer, RunningRequests]:
    running = RunningRequests()
    lifecycle: Any = SimpleNamespace(model=ModelInfo("m", 8192, 49152, 16, (2,)), running=running)
    return GenerationServicer(lifecycle, status=status), running


@pytest.mark.anyio
async def test_server_info_and_load() -> None:
    status = ServerStatus(
        lambda: PODS, 2, lambda: 3, router_worker=1, num_router_workers=2, serving=True, http_port=8000
    )
    servicer, _ = _servicer(status)
    context: Any = None
    info = await servicer.GetServerInfo(generation_pb2.GetServerInfoRequest(), context)
    assert info == generation_pb2.GetServerInfoResponse(
        model=generation_pb2.GetModelInfoResponse(
            model_id="m", max_model_len=8192, vocab_size=49152, block_size=16, eos_token_ids=[2]
        ),
        roles=["router", "prefill", "decode"],
        pods=[
            generation_pb2.PodSummary(
                pod_id="decode-0",
                role="decode",
                address="127.0.0.1:2",
                generation=7,
                draining=True,
                tensor_parallel_size=2,
                pipeline_parallel_size=1,
            ),
            generation_pb2.PodSummary(
                pod_id="prefill-0",
                role="prefill",
                address="127.0.0.1:1",
                generation=5,
                tensor_parallel_size=1,
                pipeline_parallel_size=1,
            ),
        ],
        num_prefill_pods=1,
        num_decode_pods=0,
        tokenizer_pool_size=2,
        http_port=8000,
        num_router_workers=2,
    )
    load = await servicer.GetLoad(generation_pb2.GetLoadRequest(), context)
    assert (load.state, load.num_running_requests, load.router_worker) == (generation_pb2.SERVER_STATE_SERVING, 3, 1)
    assert [
        (p.pod.pod_id, p.state, p.num_running, p.num_waiting, p.num_free_blocks, p.num_total_blocks) for p in load.pods
    ] == [
        ("decode-0", generation_pb2.SERVER_STATE_DRAINING, 1, 0, 10, 16),
        ("prefill-0", generation_pb2.SERVER_STATE_SERVING, 0, 2, 0, 0),
    ]
    status.draining = True
    load = await servicer.GetLoad(generation_pb2.GetLoadRequest(), context)
    assert load.state == generation_pb2.SERVER_STATE_DRAINING


@pytest.mark.anyio
async def test_abort_answers() -> None:
    servicer, running = _servicer(ServerStatus(list, tokenizer_pool_size=1))
    context: Any = None
    started = asyncio.Event()

    async def serve() -> None:
        with running.running("r"):
            started.set()
            await asyncio.sleep(30)

    tasks = [asyncio.create_task(serve()) for _ in range(2)]
    await started.wait()
    await asyncio.sleep(0)
    answer = await servicer.Abort(generation_pb2.AbortRequest(request_id="r"), context)
    assert (answer.result, answer.num_aborted) == (generation_pb2.ABORT_RESULT_ABORTED, 2)
    await asyncio.gather(*tasks, return_exceptions=True)
    again = await servicer.Abort(generation_pb2.AbortRequest(request_id="r"), context)
    assert (again.result, again.num_aborted) == (generation_pb2.ABORT_RESULT_ALREADY_FINISHED, 0)
    unknown = await servicer.Abort(generation_pb2.AbortRequest(request_id="x"), context)
    assert unknown.result == generation_pb2.ABORT_RESULT_NOT_FOUND
