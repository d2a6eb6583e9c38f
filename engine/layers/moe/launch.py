"""How the expert kernels (`triton_moe`) are launched: their tiles by the pairs each expert gets, and the (token,
expert) pairs in blocks of one expert each. Torch only: the blocks are built with torch ops (`align`), no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers.moe.align import align_by_expert


@dataclass(frozen=True, slots=True)
class Tiles:
    """One expert kernel's launch: its N and K tile widths, warps and pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class MoETiles:
    """Both expert kernels' launches; `block_m` (pairs per block) is shared, as the pairs' blocks are."""

    block_m: int
    gate_up: Tiles
    down: Tiles


def moe_tiles(num_pairs: int, num_local_experts: int, dtype: torch.dtype) -> MoETiles:
    """The launches by the pairs an expert gets on average: small M tiles (and narrow N tiles, for more programs
    streaming the weights) at decode, wider ones for prefill. float32 tiles take twice the shared memory: two stages
    of the widest (gate + up) fit where three do not.

    Up to 64 pairs (8 tokens of top-8 decode): two warps per program, gate_up with four stages (bench.kernels.moe_tiles,
    Qwen3-30B-A3B's experts on an H200, 2026-12-02: 16.2 / 10.0 us for gate_up / down at one token against 16.8 /
    10.2 with four warps and three stages, 46.9 / 27.2 against 51.5 / 28.2 at four tokens; none of the 54 tiles tried
    came nearer copy bandwidth). Larger sizes were not swept."""
    wide = dtype == torch.float32
    stages = 2 if wide else 3
    per_expert = num_pairs / num_local_experts
    if num_pairs <= 64:
        return MoETiles(16, Tiles(32, 128, 2, 2 if wide else 4), Tiles(32, 128, 2, stages))
    if per_expert <= 16:
        block_m, tiles = 16, Tiles(32, 128, 4, stages)
    elif per_expert <= 64:
        block_m, tiles = 32, Tiles(64, 64, 4, stages)
    else:
        block_m, tiles = 64, Tiles(128, 64, 8, stages)
    return MoETiles(block_m, tiles, tiles)


@dataclass(frozen=True, slots=True)
class PairBlocks:
    """The (token, expert) pairs in blocks of one expert each, as both kernels read them: `num_blocks` blocks of
    `block_m` pairs (`sorted_pair_ids`, the block's global expert id minus `expert_offset` in `block_expert_ids`),
    or with `pair_per_block` one pair per block read from the routing directly."""

    sorted_pair_ids: torch.Tensor
    block_expert_ids: torch.Tensor
    expert_offset: int
    num_blocks: int
    num_pairs: int
    top_k: int
    block_m: int
    pair_per_block: bool


def pair_blocks(topk_ids: torch.Tensor, num_local_experts: int, first_expert: int, block_m: int) -> PairBlocks:
    """A few pairs (batch-1 decode: top_k distinct experts) run one block each, straight from topk_ids: the sort's
    dozen small launches per layer would cost more than the padding rows' wasted MACs. More are sorted by expert."""
    num_tokens, top_k = topk_ids.shape
    num_pairs = num_tokens * top_k
    if num_pairs <= block_m:
        pair_ids = topk_ids.contiguous()
        return PairBlocks(pair_ids, pair_ids, first_expert, num_pairs, num_pairs, top_k, block_m, True)
    blocks = align_by_expert(topk_ids, num_local_experts, first_expert, block_m)
    num_blocks = blocks.block_expert_ids.shape[0]
    return PairBlocks(blocks.sorted_pair_ids, blocks.block_expert_ids, 0, num_blocks, num_pairs, top_k, block_m, False)
