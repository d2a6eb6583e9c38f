"""Scripted prefill and decode pods (grpc.aio servicers on real sockets) and a router wired to them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from transformers import PreTrainedTokenizerBase

from common.block_hash import BlockHash
from common.errors import UnavailableError
from common.grpc.errors import ErrorInterceptor, abort_with, rich_status
from common.pod_registry import PodInfo, PodRole
from pdserve.v1 import (
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2_grpc,
    kv_transfer_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
    sampling_pb2,
)
from router.admission.admission import RouterAdmission
from router.completion.migration import RetryBudget
from router.completion.request_lifecycle import RequestLifecycle
from router.completion.run_context import RunContext
from router.config import RouterConfig
from router.model_info import ModelInfo
from router.pods.local_load import LocalLoads
from router.pods.pod_view import PodView
from router.pods.routing_policy import RoutingPolicy
from router.server import GenerationServicer
from router.tokenizer.tokenizer_pool import TokenizerPool

MODEL = "smollm2-135m"
BLOCK_SIZE = 16
WAIT_S = 5.0
"""Bound on every wait in the fakes: a test that would hang fails instead."""

Context = grpc.aio.ServicerContext[Any, Any]


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


async def _bounded_wait(event: asyncio.Event) -> bool:
    try:
        await asyncio.wait_for(event.wait(), WAIT_S)
    except TimeoutError:
        return False
    return True


@dataclass
class FakePrefill(prefill_pb2_grpc.PrefillServiceServicer):
    """Answers Prefill with `first_token_id`, then (after `transfer_gate`) a TransferDone."""

    first_token_id: int = 1
    later_first_token_ids: Sequence[int] = ()
    """The first tokens of the 2nd, 3rd, ... Prefill calls (`first_token_id` when not given)."""
    num_cached_tokens: int = 0
    finish_reason: int = sampling_pb2.FINISH_REASON_UNSPECIFIED
    stop_token_id: int | None = None
    fail: Exception | None = None
    """Raised (as its gRPC status) before the first token."""
    first_token_gate: asyncio.Event | None = None
    transfer_gate: asyncio.Event | None = None
    fail_after_first: Exception | None = None
    """Raised (as its gRPC status) after the first token, instead of TransferDone."""
    num_bytes: int = 4096
    requests: list[prefill_pb2.PrefillRequest] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: Context
    ) -> AsyncIterator[prefill_pb2.PrefillResponse]:
        self.requests.append(request)
        ended = False
        try:
            if self.fail is not None:
                ended = True
                await abort_with(context, self.fail)
            if self.first_token_gate is not None:
                await self.first_token_gate.wait()
            stop = None if self.stop_token_id is None else sampling_pb2.StopReason(stop_token_id=self.stop_token_id)
            later = self.later_first_token_ids[len(self.requests) - 2 : len(self.requests) - 1]
            first = prefill_pb2.FirstToken(
                token_id=later[0] if later else self.first_token_id,
                num_cached_tokens=self.num_cached_tokens,
                finish_reason=self.finish_reason,  # type: ignore[arg-type]
                stop_reason=stop,
                logprob=-0.5 if request.sampling_params.logprobs else None,
            )
            yield prefill_pb2.PrefillResponse(first_token=first)
            if self.transfer_gate is not None:
                await _bounded_wait(self.transfer_gate)
            if self.fail_after_first is not None:
                ended = True
                await abort_with(context, self.fail_after_first)
            done = prefill_pb2.TransferDone(
                num_blocks=len(request.kv_target.block_ids),
                num_bytes=self.num_bytes,
                transfer_duration=_duration(0.005),
            )
            yield prefill_pb2.PrefillResponse(transfer_done=done)
            ended = True
            self.finished.set()
        finally:
            if not ended:
                self.cancelled.set()


@dataclass
class FakeDecode(decode_pb2_grpc.DecodeServiceServicer):
    """Reserves blocks, then streams each DecodeStart's `steps` (token ids, finish reason, stop token id) on its
    DecodeStream, one per `step_delay_s`."""

    pod_id: str = "decode"
    steps: Sequence[tuple[Sequence[int], int, int | None]] = ()
    step_delay_s: float = 0.0
    generation: int = 1
    """What Reserve's KV targets name (the registry lists every fake pod as generation 1)."""
    reserve_fail: Exception | None = None
    fail_after_steps: int | None = None
    """A request streams that many steps, then the whole DecodeStream fails with `fail` (the pod dying)."""
    fail: Exception = field(default_factory=lambda: UnavailableError("Socket closed"))
    end_after_steps: int | None = None
    """A request streams that many steps, then ends with `end_error` (its own DecodeEnd; the stream goes on)."""
    end_error: Exception | None = None
    decode_gate: asyncio.Event | None = None
    """A request waits (bounded) for it before streaming; `gate_results` records whether it was set in time."""
    reserves: list[decode_pb2.ReserveRequest] = field(default_factory=list)
    decodes: list[decode_pb2.DecodeStart] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    gate_results: list[bool] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a request ends before its last step (a DecodeCancel, or its stream closing)."""

    async def Reserve(self, request: decode_pb2.ReserveRequest, context: Context) -> decode_pb2.ReserveResponse:
        self.reserves.append(request)
        if self.reserve_fail is not None:
            await abort_with(context, self.reserve_fail, field_paths={})  # as decode pods report Reserve fields
        num_blocks = -(-request.num_prompt_tokens // BLOCK_SIZE)
        layout = kv_transfer_pb2.KVLayout(
            dtype="float32", block_size=BLOCK_SIZE, num_layers=1, num_kv_heads=1, head_dim=8, block_nbytes=1024
        )
        target = kv_transfer_pb2.KVTarget(
            transfer_id=f"{self.pod_id}-t{len(self.reserves)}",
            backend=kv_transfer_pb2.TRANSFER_BACKEND_TCP,
            endpoint="127.0.0.1:1",
            block_ids=range(100, 100 + num_blocks),
            layout=layout,
            generation=self.generation,
        )
        return decode_pb2.ReserveResponse(kv_target=target, lease=_duration(10.0))

    async def DecodeStream(
        self, request_iterator: AsyncIterator[decode_pb2.DecodeStreamRequest], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStreamResponse]:
        outbox: asyncio.Queue[decode_pb2.DecodeStreamResponse | Exception] = asyncio.Queue()
        requests: dict[int, asyncio.Task[None]] = {}

        async def read() -> None:
            async for frame in request_iterator:
                if frame.HasField("start"):
                    self.decodes.append(frame.start)
                    self.entered.set()
                    requests[frame.start.key] = asyncio.create_task(self._stream(frame.start, outbox))
                elif (task := requests.pop(frame.cancel.key, None)) is not None:
                    task.cancel()

        reader = asyncio.create_task(read())
        try:
            while True:
                message = await outbox.get()
                if isinstance(message, Exception):
                    await abort_with(context, message)
                yield message
        finally:
            for task in [reader, *requests.values()]:
                task.cancel()

    async def _stream(
        self, start: decode_pb2.DecodeStart, outbox: asyncio.Queue[decode_pb2.DecodeStreamResponse | Exception]
    ) -> None:
        ended = False
        try:
            if self.decode_gate is not None:
                self.gate_results.append(await _bounded_wait(self.decode_gate))
            for index, (token_ids, finish_reason, stop_token_id) in enumerate(self.steps):
                if index == self.fail_after_steps:
                    ended = True
                    outbox.put_nowait(self.fail)
                    return
                if index == self.end_after_steps and self.end_error is not None:
                    ended = True
                    end = decode_pb2.DecodeEnd(key=start.key, error=rich_status(self.end_error, {}))
                    outbox.put_nowait(decode_pb2.DecodeStreamResponse(ends=[end]))
                    return
                if self.step_delay_s:
                    await asyncio.sleep(self.step_delay_s)
                num_logprobs = len(token_ids) if start.sampling_params.logprobs else 0
                message = decode_pb2.DecodeStreamResponse(
                    keys=[start.key],
                    num_tokens=[len(token_ids)],
                    token_ids=token_ids,
                    num_logprobs=[num_logprobs],
                    logprobs=[-1.0] * num_logprobs,
                )
                if finish_reason:
                    stop = None if stop_token_id is None else sampling_pb2.StopReason(stop_token_id=stop_token_id)
                    message.ends.add(key=start.key, finish_reason=finish_reason, stop_reason=stop)  # type: ignore[arg-type]
                outbox.put_nowait(message)
            ended = True
        finally:
            if not ended:
                self.cancelled.set()

    async def Release(self, request: decode_pb2.ReleaseRequest, context: Context) -> decode_pb2.ReleaseResponse:
        self.releases.append(request.transfer_id)
        return decode_pb2.ReleaseResponse()


def decode_steps(
    token_ids: Sequence[int], finish_reason: int = sampling_pb2.FINISH_REASON_LENGTH, stop_token_id: int | None = None
) -> list[tuple[Sequence[int], int, int | None]]:
    """One step per token; the last one finishes."""
    steps: list[tuple[Sequence[int], int, int | None]] = [([t], 0, None) for t in token_ids[:-1]]
    steps.append(([token_ids[-1]], finish_reason, stop_token_id))
    return steps


class FakeRegistry:
    """A PodLister with a fixed list."""

    def __init__(self, pods: list[PodInfo]) -> None:
        self.pods = pods

    async def list_pods(self, role: PodRole | None = None) -> list[PodInfo]:
        return [pod for pod in self.pods if role is None or pod.role == role]


@dataclass
class FakeDirectory:
    """A PrefixLookup answering `answer` (only for the live pods asked about)."""

    answer: dict[str, int] = field(default_factory=dict)
    lookups: list[tuple[list[BlockHash], dict[str, int]]] = field(default_factory=list)

    async def longest_prefix(self, block_hashes: Sequence[BlockHash], live: Mapping[str, int]) -> dict[str, int]:
        self.lookups.append((list(block_hashes), dict(live)))
        return {pod_id: n for pod_id, n in self.answer.items() if pod_id in live}


@dataclass
class Router:
    stub: generation_pb2_grpc.GenerationServiceAsyncStub
    directory: FakeDirectory
    pods: PodView
    registry: FakeRegistry
    infos: list[PodInfo]
    """Every fake pod's registry entry (listed from the start unless `router_over(listed=False)`)."""
    admission: RouterAdmission


@asynccontextmanager
async def router_over(
    prefills: Mapping[str, FakePrefill],
    decodes: Mapping[str, FakeDecode],
    pool: TokenizerPool,
    tokenizer: PreTrainedTokenizerBase,
    model: ModelInfo,
    directory: FakeDirectory | None = None,
    retry_budget: RetryBudget | None = None,
    config: RouterConfig | None = None,
    listed: bool = True,
) -> AsyncIterator[Router]:
    """Serves each fake pod and a router (GenerationServicer + ErrorInterceptor) on 127.0.0.1; `config`: its admission
    limits (default: RouterConfig's); `listed` False: the registry lists no pod until a test lists `infos`."""
    servers: list[grpc.aio.Server] = []
    infos: list[PodInfo] = []

    async def serve(pod_id: str, role: PodRole, add: Any, servicer: Any) -> None:
        server = grpc.aio.server()
        add(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        infos.append(
            PodInfo(
                pod_id=pod_id,
                role=role,
                address=f"127.0.0.1:{port}",
                model=MODEL,
                generation=1,
                num_free_blocks=1000,
                num_total_blocks=1000,
            )
        )

    for pod_id, prefill in prefills.items():
        await serve(pod_id, "prefill", prefill_pb2_grpc.add_PrefillServiceServicer_to_server, prefill)
    for pod_id, decode in decodes.items():
        await serve(pod_id, "decode", decode_pb2_grpc.add_DecodeServiceServicer_to_server, decode)
    load = LocalLoads()
    registry = FakeRegistry(infos if listed else [])
    view = PodView(registry, MODEL, refresh_s=60.0, load=load)
    await view.refresh()
    directory = directory or FakeDirectory()
    admission = RouterAdmission(config or RouterConfig(), lambda role: len(view.pods(role)))
    view.add_refresh_listener(admission.on_pods_refreshed)
    context = RunContext(view, RoutingPolicy(BLOCK_SIZE), load, tokenizer, BLOCK_SIZE, 3, time.monotonic, admission)
    if retry_budget is not None:
        context = dataclasses.replace(context, retry_budget=retry_budget)
    router = grpc.aio.server(interceptors=[ErrorInterceptor()])
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(
        GenerationServicer(RequestLifecycle(model, pool, directory, context, limits=config)), router
    )
    port = router.add_insecure_port("127.0.0.1:0")
    await router.start()
    servers.append(router)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            yield Router(stub, directory, view, registry, infos, admission)
    finally:
        await asyncio.gather(*(server.stop(None) for server in servers))
        await view.aclose()
