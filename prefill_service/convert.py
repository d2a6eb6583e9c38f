"""Protobuf <-> core values for PrefillService (what both pod roles share is `pod.convert`'s).

Conversion lives here, at the boundary: the worker never sees a protobuf message.
"""

from __future__ import annotations

from common.errors import InvalidArgumentError
from common.proto_convert import duration_to_pb, finish_reason_to_pb, stop_reason_to_pb
from kv_transfer.target import KVTarget
from pdserve.v1 import prefill_pb2
from pod.convert import kv_target_from_pb
from prefill_service.prefill_events import FirstToken, PrefillEvent, TransferDone


def request_kv_target(pb: prefill_pb2.PrefillRequest) -> KVTarget:
    """The request's KV target (required)."""
    if not pb.HasField("kv_target"):
        raise InvalidArgumentError("kv_target", "is required (from DecodeService.Reserve)")
    return kv_target_from_pb(pb.kv_target, "kv_target")


def prefill_event_to_pb(event: PrefillEvent) -> prefill_pb2.PrefillResponse:
    if isinstance(event, TransferDone):
        return prefill_pb2.PrefillResponse(
            transfer_done=prefill_pb2.TransferDone(
                num_blocks=event.num_blocks,
                num_bytes=event.num_bytes,
                transfer_duration=duration_to_pb(event.duration_s),
            )
        )
    return prefill_pb2.PrefillResponse(first_token=_first_token_to_pb(event))


def _first_token_to_pb(event: FirstToken) -> prefill_pb2.FirstToken:
    return prefill_pb2.FirstToken(
        token_id=event.token_id,
        logprob=event.logprob,
        num_cached_tokens=event.num_cached_tokens,
        prefill_duration=duration_to_pb(event.prefill_duration_s),
        finish_reason=finish_reason_to_pb(event.finish_reason),
        stop_reason=stop_reason_to_pb(event.stop_reason),
    )
