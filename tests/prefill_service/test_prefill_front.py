"""PrefillFront over a scripted engine core (commands recorded, outputs fed by the test): the checks and admission a
call meets before its request reaches the core, the first token, the transfer's end, and the aborts of calls that end
early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.errors import InvalidArgumentError, ResourceExhaustedError
from common.sampling_params import SamplingParams
from engine.core.commands import AbortRequest, AddRequest
from engine.core.outputs import CoreOutputs, ErrorInfo, TransferEnded
from engine.scheduler_output import EngineOutput
from kv_transfer.base import TransferStats
from kv_transfer.state import TransferExpiredError, TransferState
from kv_transfer.target import KVTarget
from pod.admission import Admission, AdmissionLimits
from prefill_service.prefill_events import FirstToken, PrefillEvent, TransferDone
from prefill_service.prefill_front import PrefillFront
from tests.pod.scripted_core import LAYOUT, ScriptedCore, core_ready

pytestmark = pytest.mark.anyio

PROMPT = list(range(1, 41))
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _front(limits: AdmissionLimits | None = None) -> tuple[PrefillFront, ScriptedCore]:
    ready = core_ready("")
    front = PrefillFront(ready, "tcp", 10.0, Admission(limits or AdmissionLimits()))
    core = ScriptedCore()
    front.bind(core)  # type: ignore[arg-type]
    return front, core


def _target(transfer_id: str, lease_s: float | None = 9.0) -> KVTarget:
    return KVTarget(transfer_id, "tcp", "127.0.0.1:9", (1, 2, 3), LAYOUT, lease_s)


def _first(req_id: str, token_id: int = 77, finish_reason: str | None = "length") -> EngineOutput:
    return EngineOutput(req_id, [token_id], [None], finish_reason, None, len(PROMPT), 16)


def _done(req_id: str) -> TransferEnded:
    return TransferEnded(req_id, TransferState.DONE, TransferStats(req_id, TransferState.DONE, 3072, 3, 2, 0.004))


async def _events(calls: AsyncIterator[PrefillEvent]) -> list[PrefillEvent]:
    return [event async for event in calls]


async def test_first_token_then_transfer_done() -> None:
    front, core = _front()
    call = asyncio.ensure_future(_events(front.prefill(PROMPT, GREEDY, _target("t"), None, "req")))
    await asyncio.sleep(0)
    (add,) = core.commands
    assert isinstance(add, AddRequest)
    # NOTE: max_tokens is forced to 1 (the decode pod does the rest); keepalives a third of the target's lease.
    assert (add.req_id, add.params.max_tokens, add.keepalive_s, add.kv_target) == ("t", 1, 3.0, _target("t"))
    core.on_outputs(CoreOutputs(outputs=[_first("t")]))
    core.on_outputs(CoreOutputs(transfers_ended=[_done("t")]))
    first, done = await call
    assert isinstance(first, FirstToken) and (first.token_id, first.num_cached_tokens) == (77, 16)
    assert first.finish_reason is None  # max_tokens 4: the decode pod goes on
    assert done == TransferDone(3, 3072, 0.004)
    assert front.num_in_flight == 0 and core.commands == [add]


async def test_a_first_token_that_ends_the_request_aborts_the_transfer() -> None:
    front, core = _front()
    call = asyncio.ensure_future(_events(front.prefill(PROMPT, SamplingParams(max_tokens=1), _target("t"))))
    await asyncio.sleep(0)
    core.on_outputs(CoreOutputs(outputs=[_first("t")]))
    (first,) = await call
    assert isinstance(first, FirstToken) and first.finish_reason == "length"
    assert core.commands[-1] == AbortRequest("t")


async def test_a_transfer_that_fails_before_the_first_token_fails_the_call_with_its_error() -> None:
    front, core = _front()
    call = asyncio.ensure_future(_events(front.prefill(PROMPT, GREEDY, _target("t"))))
    await asyncio.sleep(0)
    expired = ErrorInfo("KV transfer 't' ended expired", code="expired")
    stats = TransferStats("t", TransferState.EXPIRED, 0, 0, 1, 10.0)
    core.on_outputs(CoreOutputs(transfers_ended=[TransferEnded("t", TransferState.EXPIRED, stats, expired)]))
    with pytest.raises(TransferExpiredError, match="ended expired"):
        await call
    assert core.commands[-1:] != [AbortRequest("t")]  # the transfer already ended: nothing to abort


async def test_a_cancelled_call_aborts_its_request_and_transfer() -> None:
    front, core = _front()
    call = asyncio.ensure_future(_events(front.prefill(PROMPT, GREEDY, _target("t"))))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert core.commands[-1] == AbortRequest("t") and front.num_in_flight == 0


async def test_checks_and_admission_come_before_the_core_hears_of_a_call() -> None:
    front, core = _front(AdmissionLimits(max_waiting_requests=1, max_retry_s=2.5))
    first = asyncio.ensure_future(_events(front.prefill(PROMPT, GREEDY, _target("a"))))
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhaustedError) as refused:
        await _events(front.prefill(PROMPT, GREEDY, _target("b")))
    assert str(refused.value) == "overloaded: 1 requests waiting (limit 1)"
    assert refused.value.retry_after_s == 2.5
    with pytest.raises(InvalidArgumentError) as duplicate:
        await _events(front.prefill(PROMPT, GREEDY, _target("a")))
    assert duplicate.value.field == "kv_target.transfer_id"
    with pytest.raises(InvalidArgumentError) as blocks:
        await _events(front.prefill(PROMPT[:10], GREEDY, _target("c")))
    assert blocks.value.field == "kv_target.block_ids"
    assert [c.req_id for c in core.commands] == ["a"]  # type: ignore[union-attr]
    core.on_outputs(CoreOutputs(outputs=[_first("a")], transfers_ended=[_done("a")]))
    assert [type(e) for e in await first] == [FirstToken, TransferDone]
