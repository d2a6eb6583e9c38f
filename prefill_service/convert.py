"""Protobuf <-> core values for the pods' RPCs (PrefillService, and the parts DecodeService shares).

Conversion lives here, at the boundary: the workers never see a protobuf message.
"""

from __future__ import annotations

from common.errors import InvalidArgumentError
from common.proto_convert import duration_to_pb, finish_reason_to_pb, stop_reason_to_pb
from common.proto_convert import sampling_params_from_pb as common_sampling_params_from_pb
from common.sampling_params import SamplingParams
from kv_transfer.layout import KVLayout
from pdserve.v1 import kv_transfer_pb2, prefill_pb2, sampling_pb2
from prefill_service.prefill_events import FirstToken, KVTarget, PrefillEvent, TransferDone

_BACKENDS = {
    "tcp": kv_transfer_pb2.TRANSFER_BACKEND_TCP,
    "cuda_ipc": kv_transfer_pb2.TRANSFER_BACKEND_CUDA_IPC,
    "nccl": kv_transfer_pb2.TRANSFER_BACKEND_NCCL,
    "in_process": kv_transfer_pb2.TRANSFER_BACKEND_IN_PROCESS,
}
_BACKEND_NAMES = {value: name for name, value in _BACKENDS.items()}


def sampling_params_from_pb(pb: sampling_pb2.SamplingParams) -> SamplingParams:
    """The engine's SamplingParams; n must be unset or 1 (InvalidArgumentError otherwise)."""
    if pb.HasField("n") and pb.n != 1:
        raise InvalidArgumentError("n", f"must be unset or 1 (the router fans n > 1 out), got {pb.n}")
    return common_sampling_params_from_pb(pb)


def kv_layout_to_pb(layout: KVLayout) -> kv_transfer_pb2.KVLayout:
    return kv_transfer_pb2.KVLayout(
        dtype=layout.dtype,
        block_size=layout.block_size,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_nbytes=layout.block_nbytes,
    )


def kv_layout_from_pb(pb: kv_transfer_pb2.KVLayout, field: str) -> KVLayout:
    """The layout a peer announced; InvalidArgumentError naming `field` if it is not a valid one."""
    try:
        layout = KVLayout(pb.dtype, pb.block_size, pb.num_layers, pb.num_kv_heads, pb.head_dim)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{field}.{exc.field}", exc.description) from exc
    if pb.block_nbytes != layout.block_nbytes:
        raise InvalidArgumentError(
            f"{field}.block_nbytes", f"{pb.block_nbytes} does not match the other fields ({layout.block_nbytes})"
        )
    return layout


def backend_to_pb(backend: str) -> kv_transfer_pb2.TransferBackend.ValueType:
    return _BACKENDS[backend]


def backend_from_pb(pb: kv_transfer_pb2.TransferBackend.ValueType, field: str) -> str:
    name = _BACKEND_NAMES.get(pb)
    if name is None:
        raise InvalidArgumentError(field, f"unsupported KV transfer backend {kv_transfer_pb2.TransferBackend.Name(pb)}")
    return name


def kv_target_from_pb(pb: prefill_pb2.PrefillRequest) -> KVTarget:
    if not pb.HasField("kv_target"):
        raise InvalidArgumentError("kv_target", "is required (from DecodeService.Reserve)")
    target = pb.kv_target
    return KVTarget(
        transfer_id=target.transfer_id,
        backend=backend_from_pb(target.backend, "kv_target.backend"),
        endpoint=target.endpoint,
        block_ids=tuple(target.block_ids),
        layout=kv_layout_from_pb(target.layout, "kv_target.layout"),
        lease_s=target.lease.ToNanoseconds() / 1e9 if target.HasField("lease") else None,
    )


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
