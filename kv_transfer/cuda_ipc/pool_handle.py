"""A CUDA IPC handle of a KV pool, as the cuda_ipc sender's HELLO carries it to the receiver."""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from kv_transfer.state import ProtocolError

_BYTES_FIELDS = ("ipc_handle", "ref_counter_handle", "event_handle")


@dataclass(frozen=True, slots=True)
class PoolHandle:
    """Everything another process needs to map a pool's byte rows [num_blocks, row_nbytes].

    NOTE: the caching allocator carves tensors out of larger cudaMalloc segments, and an IPC handle names a whole
    segment: `storage_offset_nbytes` is where the pool's storage starts inside it (torch adds it when it opens the
    handle), `view_offset_nbytes` where the rows start inside the storage. The ref counter and event fields are
    torch's own bookkeeping of shared CUDA storage (`UntypedStorage._share_cuda_`), passed through as they are.
    """

    ipc_handle: bytes
    storage_nbytes: int
    storage_offset_nbytes: int
    view_offset_nbytes: int
    num_blocks: int
    row_nbytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool

    @classmethod
    def export(cls, rows: torch.Tensor) -> PoolHandle:
        """The handle of contiguous CUDA byte rows (`pool_io.pool_bytes` of a pool)."""
        (_, ipc_handle, storage_nbytes, storage_offset, ref_handle, ref_offset, event_handle, event_sync_required) = (
            rows.untyped_storage()._share_cuda_()
        )
        return cls(
            ipc_handle=ipc_handle,
            storage_nbytes=storage_nbytes,
            storage_offset_nbytes=storage_offset,
            view_offset_nbytes=int(rows.storage_offset()),
            num_blocks=rows.shape[0],
            row_nbytes=rows.shape[1],
            ref_counter_handle=ref_handle,
            ref_counter_offset=ref_offset,
            event_handle=event_handle or b"",
            event_sync_required=bool(event_sync_required),
        )

    def open(self, device: torch.device) -> torch.Tensor:
        """The rows mapped into this process as a tensor on `device`. A pool on another GPU stays there: kernels on
        `device` read it over peer access (CUDA enables it when it opens the handle)."""
        storage = torch.UntypedStorage._new_shared_cuda(
            device.index,
            self.ipc_handle,
            self.storage_nbytes,
            self.storage_offset_nbytes,
            self.ref_counter_handle,
            self.ref_counter_offset,
            self.event_handle,
            self.event_sync_required,
        )
        rows = torch.empty(0, dtype=torch.uint8, device=device)
        shape, strides = (self.num_blocks, self.row_nbytes), (self.row_nbytes, 1)
        return rows.set_(storage, self.view_offset_nbytes, shape, strides)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _BYTES_FIELDS:
            data[name] = base64.b64encode(data[name]).decode()
        return data

    @classmethod
    def from_dict(cls, data: Any) -> PoolHandle:
        """Inverse of `to_dict`; ProtocolError for anything else."""
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ProtocolError(f"a cuda_ipc pool handle has the fields {names}, got {data!r:.200}")
        values = dict(data)
        try:
            for name in _BYTES_FIELDS:
                values[name] = base64.b64decode(values[name], validate=True)
        except (TypeError, binascii.Error) as error:
            raise ProtocolError(f"bad cuda_ipc pool handle: {error}") from None
        handle = cls(**values)
        counts = (handle.storage_nbytes, handle.storage_offset_nbytes, handle.view_offset_nbytes, handle.num_blocks)
        if not all(isinstance(n, int) and n >= 0 for n in (*counts, handle.row_nbytes, handle.ref_counter_offset)):
            raise ProtocolError(f"bad cuda_ipc pool handle sizes: {data!r:.200}")
        if handle.view_offset_nbytes + handle.num_blocks * handle.row_nbytes > handle.storage_nbytes:
            raise ProtocolError("a cuda_ipc pool handle whose rows run past its storage")
        return handle
