"""Tensor-parallel layers: each rank holds a slice of a layer's weight and says which part of the checkpoint
tensor that slice is (`checkpoint_slice`), so the loader reads only that part.

Column-parallel layers split the outputs (QKV by heads, gate/up by rows, the embedding and lm_head by vocab);
row-parallel ones split the inputs and all-reduce their partial sums. They wrap `Linear`: the weight format's
`LinearMethod` creates, finishes and runs the local slice as it would a whole layer. With one rank they are the
plain layers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import Linear, LinearMethod, StackedLinear
from engine.layers.weight_init import initialized
from engine.parallel.communicator import Communicator


@dataclass(frozen=True, slots=True)
class CheckpointSlice:
    """The part of a checkpoint tensor one rank loads: `index` along `dim`; `zero`: zeros of its shape instead (a
    row-parallel bias, which only rank 0 adds)."""

    dim: int
    index: slice
    zero: bool = False


class ShardedModule(nn.Module, ABC):
    """A module whose parameters are slices of the checkpoint's tensors."""

    @abstractmethod
    def checkpoint_slice(self, shard_name: str | None, attr: str) -> CheckpointSlice:
        """The part of checkpoint tensor `attr` (of projection `shard_name` in a stacked layer) this rank loads."""


class ColumnParallelLinear(Linear, ShardedModule):
    """Output rows split over the TP ranks; each rank's output is its slice (no communication)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, method: LinearMethod, comm: Communicator):
        super().__init__(in_features, out_features // comm.rank.tp_size, bias, method)
        self.rows = comm.rank.split(out_features)
        self.comm = comm

    def checkpoint_slice(self, shard_name: str | None, attr: str) -> CheckpointSlice:
        return CheckpointSlice(0, self.rows)


class ParallelLMHead(ColumnParallelLinear):
    """The vocab-parallel lm_head: each rank's logits slice, gathered so that every rank holds all logits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather(super().forward(x))


class StackedColumnParallelLinear(StackedLinear, ShardedModule):
    """Several projections run as one GEMM (q|k|v, gate|up), each split by rows: `shard_rows[i]` are the rows of
    checkpoint projection `shard_names[i]` this rank holds (KV heads may repeat over ranks)."""

    def __init__(
        self,
        in_features: int,
        shard_names: tuple[str, ...],
        shard_rows: tuple[slice, ...],
        bias: bool,
        method: LinearMethod,
    ) -> None:
        sizes = tuple(rows.stop - rows.start for rows in shard_rows)
        super().__init__(in_features, shard_names, sizes, bias, method)
        self.checkpoint_rows = dict(zip(shard_names, shard_rows, strict=True))

    def checkpoint_slice(self, shard_name: str | None, attr: str) -> CheckpointSlice:
        assert shard_name is not None
        return CheckpointSlice(0, self.checkpoint_rows[shard_name])


class RowParallelLinear(Linear, ShardedModule):
    """Input columns split over the TP ranks; the partial outputs are summed by an all-reduce (the bias is
    loaded on rank 0 only, zeros elsewhere, so that it is added once)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, method: LinearMethod, comm: Communicator):
        super().__init__(in_features // comm.rank.tp_size, out_features, bias, method)
        self.columns = comm.rank.split(in_features)
        self.comm = comm

    def checkpoint_slice(self, shard_name: str | None, attr: str) -> CheckpointSlice:
        if attr == "bias":
            return CheckpointSlice(0, slice(None), zero=self.comm.rank.tp_rank > 0)
        return CheckpointSlice(1, self.columns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(super().forward(x))


class VocabParallelEmbedding(ShardedModule):
    """Embedding rows split over the TP ranks: each rank looks up the ids in its range, zeros elsewhere, and an
    all-reduce assembles the rows."""

    def __init__(self, vocab_size: int, hidden_size: int, comm: Communicator) -> None:
        super().__init__()
        self.rows = comm.rank.split(vocab_size)
        weight = initialized(torch.empty(self.rows.stop - self.rows.start, hidden_size), torch.Tensor.normal_)
        self.weight = nn.Parameter(weight, False)
        self.comm = comm

    def checkpoint_slice(self, shard_name: str | None, attr: str) -> CheckpointSlice:
        return CheckpointSlice(0, self.rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.comm.rank.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.rows.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.comm.all_reduce(hidden.masked_fill_(outside.unsqueeze(-1), 0.0))
