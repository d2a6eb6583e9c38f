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
    of `block_m` rows, each expert's pairs in pair order; pairs of other experts (other expert-parallel ranks) appear
    nowhere.

    NOTE: a counting sort (a running count per expert over a [pairs, experts] one-hot), not argsort: every op is an
    elementwise, scan or scatter kernel, deterministic and safe to capture in a CUDA graph.
    """
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    local = topk_ids.flatten().to(torch.int64) - first_expert
    # NOTE: bucket num_local_experts gathers the pairs this rank does not hold; it is dropped.
    local = torch.where((local >= 0) & (local < num_local_experts), local, num_local_experts)
    one_hot = torch.zeros(num_pairs, num_local_experts + 1, dtype=torch.int32, device=device)
    running = one_hot.scatter_(1, local[:, None], 1).cumsum(0, dtype=torch.int32)
    rank_in_expert = running.gather(1, local[:, None]).squeeze(1) - 1
    counts = running[-1, :num_local_experts].to(torch.int64)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    num_blocks = max_blocks(num_pairs, num_local_experts, block_m)
    capacity = num_blocks * block_m
    # NOTE: the dropped bucket's pairs all land on one slot past the end, cut off below.
    starts = torch.cat([padded_end - padded, torch.full((1,), capacity, dtype=torch.int64, device=device)])
    dest = starts[local] + torch.where(local < num_local_experts, rank_in_expert, 0)
    sorted_pair_ids = torch.full((capacity + 1,), num_pairs, dtype=torch.int32, device=device)
    sorted_pair_ids.scatter_(0, dest, torch.arange(num_pairs, dtype=torch.int32, device=device))
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = torch.where(block_expert < num_local_experts, block_expert, -1).to(torch.int32)
    return ExpertBlocks(sorted_pair_ids[:capacity], block_expert, num_pairs, block_m)
