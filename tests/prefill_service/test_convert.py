"""Protobuf <-> core values of PrefillService (prefill_service.convert)."""

from __future__ import annotations

from pdserve.v1 import sampling_pb2
from prefill_service.convert import prefill_event_to_pb
from prefill_service.prefill_events import FirstToken, TransferDone


def test_prefill_events() -> None:
    first = prefill_event_to_pb(FirstToken(11, None, 32, 0.25, "stop", 2))
    assert first.first_token.token_id == 11 and not first.first_token.HasField("logprob")
    assert first.first_token.num_cached_tokens == 32
    assert first.first_token.prefill_duration.ToNanoseconds() == 250_000_000
    assert first.first_token.finish_reason == sampling_pb2.FINISH_REASON_STOP
    assert first.first_token.stop_reason.stop_token_id == 2
    done = prefill_event_to_pb(TransferDone(3, 49152, 0.5)).transfer_done
    assert (done.num_blocks, done.num_bytes, done.transfer_duration.ToNanoseconds()) == (3, 49152, 500_000_000)
