"""DecodeFront over a scripted engine core (commands recorded, outputs fed by the test): admission of reservations,
a cancelled Reserve, one message per stream per engine step, merging for a slow reader, ends, cancels, and the
core's death; and the servicer's protobuf of a batch."""

from __future__ import annotations

import asyncio

import pytest
from google.rpc import code_pb2

from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.sampling_params import SamplingParams
from decode_service.decode_front import DecodeFront
from decode_service.decode_stream import DecodeStart, DecodeStreamSession, StreamBatch, StreamEnd
from decode_service.server import _response
from engine.core.client import EngineDeadError
from engine.core.commands import AbortRequest, AddPrefilledRequest, KVReserved, ReserveKV
from engine.core.outputs import CoreOutputs, ErrorInfo, RequestFailed
from engine.scheduler_output import EngineOutput
from kv_transfer.state import TransferExpiredError
from pod.admission import Admission, AdmissionLimits
from tests.pod.scripted_core import LAYOUT, ScriptedCore, core_ready

pytestmark = pytest.mark.anyio

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _front(limits: AdmissionLimits | None = None) -> tuple[DecodeFront, ScriptedCore]:
    ready = core_ready("127.0.0.1:9")
    front = DecodeFront(ready, "tcp", 10.0, Admission(limits or AdmissionLimits()), generation=7)
    core = ScriptedCore()
    front.bind(core)  # type: ignore[arg-type]
    return front, core


def _output(req_id: str, token_ids: list[int], finish_reason: str | None = None) -> EngineOutput:
    return EngineOutput(req_id, token_ids, [-0.5] * len(token_ids), finish_reason, None, 40, 0)


async def _reserve(front: DecodeFront, core: ScriptedCore, block_ids: tuple[int, ...] | None) -> object:
    reserving = asyncio.ensure_future(front.reserve(40, 8, "req"))
    await asyncio.sleep(0)
    command = core.commands[-1]
    assert isinstance(command, ReserveKV) and command.num_prompt_tokens == 40 and command.lease_s == 10.0
    core.on_outputs(CoreOutputs(replies=[KVReserved(command.req_id, block_ids)]))
    return await reserving


async def test_a_reservation_names_the_blocks_the_core_reserved() -> None:
    front, core = _front()
    target = await _reserve(front, core, (4, 5, 6))
    assert (target.block_ids, target.endpoint, target.layout, target.lease_s, target.generation) == (  # type: ignore[attr-defined]
        (4, 5, 6),
        "127.0.0.1:9",
        LAYOUT,
        10.0,
        7,
    )
    assert front.num_in_flight == 1
    with pytest.raises(ResourceExhaustedError, match="no 3 free KV blocks for 40 prompt tokens"):
        await _reserve(front, core, None)
    assert front.num_in_flight == 1


async def test_reservations_beyond_the_limit_are_refused_until_one_ends() -> None:
    front, core = _front(AdmissionLimits(max_waiting_requests=2, max_retry_s=1.5))
    first = await _reserve(front, core, (1, 2, 3))
    await _reserve(front, core, (4, 5, 6))
    with pytest.raises(ResourceExhaustedError) as refused:
        await front.reserve(40, 8, "c")
    assert str(refused.value) == "overloaded: 2 requests waiting (limit 2)"
    assert refused.value.retry_after_s == 1.5
    front.release(first.transfer_id)  # type: ignore[attr-defined]
    await _reserve(front, core, (7, 8, 9))


async def test_a_reserve_cancelled_before_its_answer_aborts_what_the_core_may_reserve() -> None:
    front, core = _front()
    reserving = asyncio.ensure_future(front.reserve(40, 8, "req"))
    await asyncio.sleep(0)
    reserving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reserving
    (reserve, abort) = core.commands
    assert isinstance(reserve, ReserveKV) and abort == AbortRequest(reserve.req_id)
    assert front.num_in_flight == 0


async def test_one_message_per_stream_per_step_and_merged_steps_for_a_slow_reader() -> None:
    front, core = _front()
    session = DecodeStreamSession("router")
    for key, transfer_id in ((1, "a"), (2, "b")):
        front.start(session, DecodeStart(key, f"req-{key}", transfer_id, [1] * 40, 3, PARAMS))
    assert [type(c) for c in core.commands] == [AddPrefilledRequest, AddPrefilledRequest]
    core.on_outputs(CoreOutputs(outputs=[_output("a", [10]), _output("b", [20])]))
    batch = await session.next_batch()
    assert batch == StreamBatch(keys=[1, 2], num_tokens=[1, 1], token_ids=[10, 20], num_logprobs=[0, 0])
    # The reader is slow: two steps wait, and go out as one message.
    core.on_outputs(CoreOutputs(outputs=[_output("a", [11]), _output("b", [21])]))
    core.on_outputs(CoreOutputs(outputs=[_output("a", [12], "length"), _output("b", [22])]))
    batch = await session.next_batch()
    assert batch is not None
    assert (batch.keys, batch.token_ids) == ([1, 2, 1, 2], [11, 21, 12, 22])
    assert batch.ends == [StreamEnd(1, "length", None)]
    assert session.transfer_ids == {2: "b"}


async def test_a_failure_ends_its_request_with_the_error_and_a_cancel_aborts_in_the_core() -> None:
    front, core = _front()
    session = DecodeStreamSession("router")
    front.start(session, DecodeStart(1, "req-1", "a", [1] * 40, 3, PARAMS))
    front.start(session, DecodeStart(2, "req-2", "b", [1] * 40, 3, PARAMS))
    front.start(session, DecodeStart(3, "req-3", "a", [1] * 40, 3, PARAMS))
    expired = ErrorInfo("KV transfer 'a' ended expired before all blocks arrived", code="expired")
    core.on_outputs(CoreOutputs(failures=[RequestFailed("a", expired)]))
    front.cancel(session, 2)
    assert core.commands[-1] == AbortRequest("b")
    batch = await session.next_batch()
    assert batch is not None
    [duplicate, failed] = batch.ends
    assert duplicate.key == 3 and isinstance(duplicate.error, InvalidArgumentError)
    assert failed.key == 1 and isinstance(failed.error, TransferExpiredError)
    assert front.num_in_flight == 0
    message = _response(batch)
    assert [end.error.code for end in message.ends] == [code_pb2.INVALID_ARGUMENT, code_pb2.ABORTED]


async def test_the_cores_death_fails_every_open_request_and_reserve() -> None:
    front, _ = _front()
    session = DecodeStreamSession("router")
    front.start(session, DecodeStart(1, "req-1", "a", [1] * 40, 3, PARAMS))
    reserving = asyncio.ensure_future(front.reserve(40, 8, "req"))
    await asyncio.sleep(0)
    front.on_dead(EngineDeadError("the engine core process exited"))
    with pytest.raises(UnavailableError, match="the engine core process exited"):
        await reserving
    batch = await session.next_batch()
    assert batch is not None and [(end.key, type(end.error)) for end in batch.ends] == [(1, EngineDeadError)]


async def test_logprobs_travel_with_the_requests_that_asked_for_them() -> None:
    front, core = _front()
    session = DecodeStreamSession("router")
    front.start(session, DecodeStart(1, "r1", "a", [1] * 40, 3, PARAMS))
    front.start(session, DecodeStart(2, "r2", "b", [1] * 40, 3, SamplingParams(max_tokens=8, logprobs=True)))
    core.on_outputs(CoreOutputs(outputs=[_output("a", [10]), _output("b", [20, 21])]))
    message = _response(await session.next_batch())  # type: ignore[arg-type]
    assert (list(message.num_logprobs), list(message.logprobs)) == ([0, 2], [-0.5, -0.5])
