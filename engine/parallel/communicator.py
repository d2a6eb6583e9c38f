"""The collectives a sharded model runs: all-reduce and all-gather over its TP group, activations sent stage to
stage, and one MIN over all ranks at start-up. With one rank every operation is the identity.

The backend is torch.distributed's (NCCL on CUDA, gloo on CPU), chosen once by the worker that creates the groups.
On CUDA, all-reduces that fit a peer-memory buffer (`PeerAllReduce`: the small messages of decode) skip NCCL where
every TP peer maps the others' memory; the rest go to NCCL. Both can be captured in a CUDA graph, so decode graphs
hold their collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.parallel.peer_all_reduce import PeerAllReduce
from engine.parallel.rank import ParallelRank


class Communicator:
    def __init__(
        self,
        rank: ParallelRank,
        tp_group: dist.ProcessGroup | None = None,
        peer_all_reduce: PeerAllReduce | None = None,
        expert_parallel: bool = False,
    ) -> None:
        self.rank = rank
        self.tp_group = tp_group
        self.peer_all_reduce = peer_all_reduce
        # NOTE: MoE layers then spread their experts over the TP group (each rank holds some experts whole)
        # instead of splitting every expert's intermediate rows (`engine.models.moe`).
        self.expert_parallel = expert_parallel

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the TP group, in place."""
        if self.rank.tp_size == 1:
            return x
        if self.peer_all_reduce is not None and self.peer_all_reduce.fits(x):
            return self.peer_all_reduce(x)
        dist.all_reduce(x, group=self.tp_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on every TP rank -> [..., n * tp_size], rank 0's part first."""
        if self.rank.tp_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.rank.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=-1)

    def send_to_next_stage(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Hand activations to the same TP rank of the next stage."""
        peer = self.rank.world_rank + self.rank.tp_size
        for tensor in tensors:
            dist.send(tensor.contiguous(), peer)

    def recv_from_previous_stage(self, count: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`count` activations shaped and typed like `like`, from the same TP rank of the previous stage."""
        peer = self.rank.world_rank - self.rank.tp_size
        received = []
        for _ in range(count):
            tensor = torch.empty_like(like)
            dist.recv(tensor, peer)
            received.append(tensor)
        return tuple(received)

    def min_over_world(self, value: int, device: torch.device) -> int:
        """The smallest `value` any rank passes (e.g. the KV blocks every rank's memory holds)."""
        if self.rank.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())


SINGLE_RANK = Communicator(ParallelRank())
"""The communicator of an engine on one device."""
