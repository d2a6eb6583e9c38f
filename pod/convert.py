"""Protobuf <-> core values that both pod roles (and the router, which carries KV targets) share: KV layouts,
transfer backends and KV targets. Sampling params, finish and stop reasons and durations are `common.proto_convert`'s.

Conversion lives here, at the boundary: the workers never see a protobuf message.
"""

from __future__ import annotations

from common.errors import InvalidArgumentError
from common.proto_convert import duration_to_pb
from kv_transfer.layout import KVLayout
from kv_transfer.target import KVTarget
from pdserve.v1 import kv_transfer_pb2

_BACKENDS = {
    "tcp": kv_transfer_pb2.TRANSFER_BACKEND_TCP,
    "cuda_ipc": kv_transfer_pb2.TRANSFER_BACKEND_CUDA_IPC,
    "nccl": kv_transfer_pb2.TRANSFER_BACKEND_NCCL,
    "in_process": kv_transfer_pb2.TRANSFER_BACKEND_IN_PROCESS,
}
_BACKEND_NAMES = {value: name for name, value in _BACKENDS.items()}


def kv_layout_to_pb(layout: KVLayout) -> kv_transfer_pb2.KVLayout:
    return kv_transfer_pb2.KVLayout(
        dtype=layout.dtype,
        block_size=layout.block_size,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_nbytes=layout.block_nbytes,
        k_scale=layout.k_scale,
        v_scale=layout.v_scale,
        tp_rank=layout.tp_rank,
        tp_size=layout.tp_size,
        pp_rank=layout.pp_rank,
        pp_size=layout.pp_size,
    )


def kv_layout_from_pb(pb: kv_transfer_pb2.KVLayout, field: str) -> KVLayout:
    """The layout a peer announced; InvalidArgumentError naming `field` if it is not a valid one."""
    try:
        scales = (pb.k_scale if pb.HasField("k_scale") else 1.0, pb.v_scale if pb.HasField("v_scale") else 1.0)
        # NOTE: a peer from before parallel pods leaves the sizes unset (0): one device, rank 0.
        ranks = (pb.tp_rank, pb.tp_size or 1, pb.pp_rank, pb.pp_size or 1)
        layout = KVLayout(pb.dtype, pb.block_size, pb.num_layers, pb.num_kv_heads, pb.head_dim, *scales, *ranks)
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
        # NOTE: an open enum: a value this build does not know is kept as a number, and Name() would raise.
        known = pb in kv_transfer_pb2.TransferBackend.values()
        label = kv_transfer_pb2.TransferBackend.Name(pb) if known else str(pb)
        raise InvalidArgumentError(field, f"unsupported KV transfer backend {label}")
    return name


def kv_target_to_pb(target: KVTarget) -> kv_transfer_pb2.KVTarget:
    pb = kv_transfer_pb2.KVTarget(
        transfer_id=target.transfer_id,
        backend=backend_to_pb(target.backend),
        endpoint=target.endpoint,
        block_ids=target.block_ids,
        layout=kv_layout_to_pb(target.layout),
        generation=target.generation,
    )
    if target.lease_s is not None:
        pb.lease.CopyFrom(duration_to_pb(target.lease_s))
    return pb


def kv_target_from_pb(pb: kv_transfer_pb2.KVTarget, field: str) -> KVTarget:
    """The target a decode pod announced; InvalidArgumentError naming `field`'s bad sub-field."""
    return KVTarget(
        transfer_id=pb.transfer_id,
        backend=backend_from_pb(pb.backend, f"{field}.backend"),
        endpoint=pb.endpoint,
        block_ids=tuple(pb.block_ids),
        layout=kv_layout_from_pb(pb.layout, f"{field}.layout"),
        lease_s=pb.lease.ToNanoseconds() / 1e9 if pb.HasField("lease") else None,
        generation=pb.generation,
    )
