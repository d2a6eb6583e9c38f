"""Sorting (token, expert) pairs by expert for the grouped GEMMs: each expert's pairs padded to whole blocks of rows,
so that every block of the kernels' M dimension belongs to one expert.

Shapes depend only on the number of tokens (no host sync, no data-dependent size): the sort runs inside CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ExpertBlocks:
    sorted_pair_ids: torch.Tensor
    """[num_blocks * block_m] int32: pair ids (token * top_k + slot) grouped by local expert, each expert's run
    padded to a multiple of block_m with `num_pairs` (no pair)."""
    block_expert_ids: torch.Tensor
    """[num_blocks] int32: the local expert of each block; -1 for blocks past the last expert's run."""
    num_pairs: int
    block_m: int


def max_blocks(num_pairs: int, num_local_experts: int, block_m: int) -> int:
    """Blocks enough for any routing: every pair, plus a partial block for each expert that got any."""
    padded = num_pairs + min(num_local_experts, num_pairs) * (block_m - 1)
    return -(-padded // block_m)


def align_by_expert(topk_ids: torch.Tensor, num_local_experts: int, first_expert: int, block_m: int) -> ExpertBlocks:
    """topk_ids [T, k] global expert ids -> the pairs of the experts `first_expert .. + num_local_experts` in blocks
    of `block_m` rows; pairs of other experts (other expert-parallel ranks) appear nowhere."""
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    local = topk_ids.flatten().to(torch.int64) - first_expert
    # NOTE: bucket num_local_experts gathers the pairs this rank does not hold; it sorts last and is dropped.
    local = torch.where((local >= 0) & (local < num_local_experts), local, num_local_experts)
    counts = torch.zeros(num_local_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, local, torch.ones_like(local))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_local_experts] = 0
    padded_end = padded.cumsum(0)
    order = torch.argsort(local, stable=True)
    sorted_local = local[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[sorted_local]
    num_blocks = max_blocks(num_pairs, num_local_experts, block_m)
    capacity = num_blocks * block_m
    dest = torch.where(sorted_local < num_local_experts, (padded_end - padded)[sorted_local] + rank_in_expert, capacity)
    sorted_pair_ids = torch.full((capacity + 1,), num_pairs, dtype=torch.int32, device=device)
    sorted_pair_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end[:num_local_experts], block_starts, right=True)
    block_expert = torch.where(block_expert < num_local_experts, block_expert, -1).to(torch.int32)
    return ExpertBlocks(sorted_pair_ids[:capacity], block_expert, num_pairs, block_m)
