"""All-reduce over peer-mapped GPU memory for the small messages of tensor-parallel decode.

At batch 1 a decode step all-reduces one row of hidden states (8 KB on an 8B model) twice per layer; NCCL takes
~20 us per call for that, most of a TP=2 step's gain. Here each rank's GPU reads its peers' buffers directly over
NVLink (torch's symmetric memory, CUDA backend: the buffers are mapped into every peer's address space), so an
all-reduce is one kernel of a few microseconds.

Lifecycle:
1. Start-up (`PeerAllReduce.create`, collective over the TP group): every rank checks what it can see alone (CUDA,
   2, 4 or 8 ranks, torch's `symm_mem` ops, peer access from its GPU to every peer's) and the ranks agree on the
   result (MIN over the group) before any of them allocates, so no rank waits in a rendezvous its peers skip. Then
   one buffer of `max_bytes` is allocated with `symm_mem.empty` and rendezvoused (each rank maps the others'), and
   the ranks agree again that every one succeeded. Any failure: None, and the communicator keeps NCCL.
2. Per all-reduce of `x` (`fits`: bf16 or float32, contiguous, 16-byte aligned, at most `max_bytes`), in place:
   - up to `one_shot_max_bytes`, one-shot: one kernel copies `x` into this rank's buffer, meets its peers at a
     barrier (signal pads), sums every rank's buffer into `x` and meets them again, so that the next call may
     overwrite the buffer;
   - above that, two-shot: `x` is copied into the buffer; each rank reduces its 1/n of the elements from every
     buffer and writes the sum into every buffer, then gathers the whole sum into `x` (each byte crosses NVLink
     about twice instead of n - 1 times);
   - anything else goes to NCCL (the caller's choice, through `fits`).
   The kernels run on the current stream with no host synchronization: a CUDA graph captures them like any other
   kernel, and replays reuse the one buffer. Every rank issues the same calls in the same order (the same model,
   the same step), so the barriers always meet.

NOTE: the kernels spin on their peers: a rank that stops issuing collectives hangs its peers' GPUs, as with NCCL.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

ONE_SHOT_MAX_BYTES = 512 << 10
"""Messages up to this size use the one-shot kernel (decode batches up to 64 rows of a 4096-wide model in bf16)."""
MAX_BYTES = 16 << 20
"""The buffer each rank maps to its peers (a 2,048-token prefill chunk of a 4096-wide model in bf16); larger
messages go to NCCL, which is as fast there (2 H200, 2026-11-28: two-shot 76 us vs NCCL 81 at 16 MB, 143 vs 143 at
32 MB; one-shot 7 us vs NCCL 10.5 at 8 KB, two-shot ahead of one-shot from 1 MB)."""
_WORLD_SIZES = (2, 4, 8)
"""The group sizes torch's symmetric-memory kernels are compiled for."""
_DTYPES = (torch.bfloat16, torch.float32)
_ALIGNMENT = 16
_OPS = ("one_shot_all_reduce_copy_out", "two_shot_all_reduce_out")


def _has_symm_mem_ops() -> bool:
    return all(hasattr(torch.ops.symm_mem, name) for name in _OPS)


def _agree(ok: bool, group: dist.ProcessGroup, device: torch.device) -> bool:
    """True only if every rank of `group` passes True."""
    flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _local_checks(group: dist.ProcessGroup, device: torch.device, peer_devices: list[torch.device]) -> str | None:
    """Why this rank cannot take part (None: it can)."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if group.size() not in _WORLD_SIZES:
        return f"{group.size()} ranks (the kernels exist for {_WORLD_SIZES})"
    if not _has_symm_mem_ops():
        return f"torch {torch.__version__} lacks torch.ops.symm_mem.{{{', '.join(_OPS)}}}"
    for peer in peer_devices:
        if peer != device and not torch.cuda.can_device_access_peer(device, peer):
            return f"{device} cannot map the memory of {peer}"
    return None


class PeerAllReduce:
    """A TP group's all-reduce over one symmetric-memory buffer per rank (see the module docstring)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        max_bytes: int = MAX_BYTES,
        one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES,
    ) -> None:
        """Collective: allocates and rendezvouses the buffer (use `create`, which checks and agrees first)."""
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.max_bytes = max_bytes
        self.one_shot_max_bytes = one_shot_max_bytes
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)
        self._views = {dtype: self.buffer.view(dtype) for dtype in _DTYPES}

    @classmethod
    def create(
        cls,
        group: dist.ProcessGroup,
        device: torch.device,
        peer_devices: list[torch.device],
        max_bytes: int = MAX_BYTES,
        one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES,
    ) -> PeerAllReduce | None:
        """Collective over `group`: the all-reduce if every rank can map every other's buffer, else None."""
        # NOTE: no multicast object is wanted (no multimem op runs here); where multicast may harm a shared host it
        # is off through this variable already.
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        reason = _local_checks(group, device, peer_devices)
        if not _agree(reason is None, group, device):
            logger.info("TP all-reduce: NCCL (%s)", reason or "a peer cannot use peer memory")
            return None
        try:
            peer_all_reduce = cls(group, device, max_bytes, one_shot_max_bytes)
        except (RuntimeError, OSError) as exc:
            logger.warning("TP all-reduce: NCCL (symmetric memory failed: %s)", exc)
            peer_all_reduce = None
        if not _agree(peer_all_reduce is not None, group, device):
            return None
        logger.info("TP all-reduce: peer memory up to %d bytes (one-shot up to %d)", max_bytes, one_shot_max_bytes)
        return peer_all_reduce

    def fits(self, x: torch.Tensor) -> bool:
        """Whether `x` takes this path (the same answer on every rank: the ranks reduce equal shapes)."""
        nbytes = x.numel() * x.element_size()
        return (
            x.dtype in _DTYPES
            and 0 < nbytes <= self.max_bytes
            and nbytes % _ALIGNMENT == 0
            and x.is_contiguous()
            and (x.storage_offset() * x.element_size()) % _ALIGNMENT == 0
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place (`fits(x)` must hold)."""
        if x.numel() * x.element_size() <= self.one_shot_max_bytes:
            return self.one_shot(x)
        return self.two_shot(x)

    def one_shot(self, x: torch.Tensor) -> torch.Tensor:
        """In place, one kernel: x into this rank's buffer, barrier, x = the sum of every rank's buffer, barrier."""
        flat = x.view(-1)
        buffer = self._views[x.dtype][: flat.numel()]
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(buffer, flat, "sum", self.group_name, flat)
        return x

    def two_shot(self, x: torch.Tensor) -> torch.Tensor:
        """In place: x into this rank's buffer; each rank sums its 1/n of the buffers; x gathers the n parts."""
        flat = x.view(-1)
        buffer = self._views[x.dtype][: flat.numel()]
        buffer.copy_(flat)
        torch.ops.symm_mem.two_shot_all_reduce_out(buffer, "sum", self.group_name, flat)
        return x
