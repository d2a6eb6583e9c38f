"""What the MoE layer must satisfy on any device: the Triton kernels (`engine.layers.moe.triton_moe`, the routing of
`triton_routing`) against the torch reference (`engine.layers.moe.torch_moe`, `routing`); `run_interpreted_checks`
runs small float32 cases in Triton's interpreter, tests/engine/test_moe_gpu.py the real shapes on the GPU."""

from __future__ import annotations

import torch

from engine.layers.kernels import moe_sync_counters
from engine.layers.moe import launch, torch_moe, triton_moe, triton_routing
from engine.layers.moe.routing import select_experts


def make_case(
    num_tokens: int, num_experts: int, top_k: int, hidden: int, intermediate: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    """(x, w13, w2, topk_weights, topk_ids) with weights scaled as a trained layer's (outputs of order 1)."""
    gen = torch.Generator(device).manual_seed(num_tokens * 1000 + num_experts)
    x = torch.randn(num_tokens, hidden, generator=gen, device=device).to(dtype)
    w13 = (torch.randn(num_experts, 2 * intermediate, hidden, generator=gen, device=device) / hidden**0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, intermediate, generator=gen, device=device) / intermediate**0.5).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    topk_weights, topk_ids = select_experts(logits, top_k, renormalize=True)
    return x, w13, w2, topk_weights, topk_ids


def check_fused_moe(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    dtype: torch.dtype,
    device: str,
    num_ranks: int = 1,
) -> None:
    """Triton == torch (float32 within 1e-5 relative; bf16 within 2e-2 of the float32 reference); with `num_ranks`
    expert-parallel parts (each rank's experts alone), the parts sum to the whole."""
    x, w13, w2, topk_weights, topk_ids = make_case(num_tokens, num_experts, top_k, hidden, intermediate, dtype, device)
    expected = torch_moe.fused_moe(x.float(), w13.float(), w2.float(), topk_weights, topk_ids, 0)
    per_rank = num_experts // num_ranks
    parts = []
    for r in range(num_ranks):
        experts = slice(r * per_rank, (r + 1) * per_rank)
        parts.append(triton_moe.fused_moe(x, w13[experts], w2[experts], topk_weights, topk_ids, r * per_rank))
    _check_sum(parts, expected, dtype, f"T={num_tokens} E={num_experts} k={top_k} ranks={num_ranks}")


def _check_sum(parts: list[torch.Tensor], expected: torch.Tensor, dtype: torch.dtype, case: str) -> None:
    """The ranks' parts sum to `expected` (float32 within 1e-5 relative; bf16 within 2e-2)."""
    actual = torch.stack(parts).float().sum(0)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    error = (actual - expected).norm() / expected.norm()
    assert error < tolerance, f"{case}: relative error {error}"


def check_moe(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    dtype: torch.dtype,
    device: str,
    num_ranks: int = 1,
    renormalize: bool = True,
) -> None:
    """The whole layer from router logits: `triton_moe.moe` == `torch_moe.moe` in float32, with the tolerances of
    `check_fused_moe`, with and without sync counters (a few tokens: the pairs' sum in the down projection's
    launch, the counters left at zero); expert-parallel parts sum to the whole."""
    gen = torch.Generator(device).manual_seed(num_tokens * 1000 + num_experts + 1)
    x, w13, w2, _, _ = make_case(num_tokens, num_experts, top_k, hidden, intermediate, dtype, device)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device).to(dtype)
    expected = torch_moe.moe(x.float(), logits, w13.float(), w2.float(), top_k, renormalize, 0)
    per_rank = num_experts // num_ranks
    for sync in (None, moe_sync_counters(hidden).to(device)):
        parts = []
        for r in range(num_ranks):
            experts = slice(r * per_rank, (r + 1) * per_rank)
            parts.append(triton_moe.moe(x, logits, w13[experts], w2[experts], top_k, renormalize, r * per_rank, sync))
        case = f"T={num_tokens} E={num_experts} k={top_k} ranks={num_ranks} sync={sync is not None}"
        _check_sum(parts, expected, dtype, case)
        assert sync is None or not sync.any(), f"{case}: counters left at {sync.tolist()}"


def check_fused_sum(
    num_tokens: int, num_experts: int, top_k: int, hidden: int, intermediate: int, dtype: torch.dtype, device: str
) -> None:
    """`run_down` with sync counters (the pairs' sum in its own launch) equals its two-launch form bit for bit, and
    leaves the counters at zero."""
    x, w13, w2, topk_weights, topk_ids = make_case(num_tokens, num_experts, top_k, hidden, intermediate, dtype, device)
    tiles = launch.moe_tiles(num_tokens * top_k, num_experts, dtype)
    pairs = launch.pair_blocks(topk_ids, num_experts, 0, tiles.block_m)
    assert pairs.pair_per_block, "the sum runs in the down projection's launch with one pair per block only"
    act = triton_moe.run_gate_up(x, w13, pairs, tiles.gate_up)
    pair_weights = topk_weights.to(torch.float32).flatten().contiguous()
    sync = moe_sync_counters(hidden).to(device)
    fused = triton_moe.run_down(act, w2, pair_weights, pairs, tiles.down, sync)
    assert torch.equal(fused, triton_moe.run_down(act, w2, pair_weights, pairs, tiles.down))
    assert not sync.any(), f"counters left at {sync.tolist()}"


INTERPRETED_CASES = [
    # (T, E, k, H, I, ranks) for the sorted grouped GEMMs: batch 1 and a few tokens (two expert-parallel ranks),
    # sorted pairs over many experts, one expert's run spanning blocks (T*k/E > 64), intermediate and hidden sizes
    # not multiples of the tiles, and sorted pairs over two expert-parallel ranks.
    (1, 8, 2, 64, 32, 1),
    (5, 8, 3, 64, 32, 2),
    (37, 16, 4, 64, 48, 1),
    (300, 4, 2, 40, 24, 1),
    (20, 8, 2, 64, 32, 2),
]


def check_routing(num_tokens: int, num_experts: int, top_k: int, renormalize: bool, device: str, ties: bool) -> None:
    """`triton_routing.select_experts`: the k largest logits, ties to the lower expert id (a stable sort's first k),
    weighted by their softmax probabilities (within 1e-6); without ties also exactly `routing.select_experts`'s ids.
    With `ties`, logits rounded to quarters, so that many tie (torch's top-k promises no order among ties)."""
    gen = torch.Generator(device).manual_seed(num_tokens + num_experts)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    if ties:
        logits = torch.round(logits * 4) / 4
    weights, ids = triton_routing.select_experts(logits, top_k, renormalize)
    expected_ids = torch.sort(-logits, dim=-1, stable=True).indices[:, :top_k]
    expected_weights = torch.softmax(logits, dim=-1).gather(1, expected_ids)
    if renormalize:
        expected_weights = expected_weights / expected_weights.sum(dim=-1, keepdim=True)
    assert torch.equal(ids.long(), expected_ids)
    assert torch.allclose(weights, expected_weights, rtol=0, atol=1e-6)
    if not ties:
        assert torch.equal(ids.long(), select_experts(logits, top_k, renormalize)[1])


LAYER_CASES = [
    # (T, E, k, H, I, ranks, renormalize) through `triton_moe.moe`: batch 1 with k = 8 of 16 experts and 3 of 6 (k
    # and E not powers of two), 4 tokens over two expert-parallel ranks without renormalization, 9 tokens (sorted).
    (1, 16, 8, 64, 32, 1, True),
    (1, 6, 3, 64, 32, 1, True),
    (4, 8, 4, 64, 48, 2, False),
    (9, 8, 2, 64, 32, 2, True),
]


def run_interpreted_checks() -> None:
    for case in INTERPRETED_CASES:
        check_fused_moe(*case[:5], torch.float32, "cpu", num_ranks=case[5])
    for t, e, k, h, i, ranks, renormalize in LAYER_CASES:
        check_moe(t, e, k, h, i, torch.float32, "cpu", ranks, renormalize)
    check_fused_sum(2, 16, 4, 80, 32, torch.float32, "cpu")
    check_routing(40, 128, 8, True, "cpu", ties=True)
    check_routing(40, 6, 3, False, "cpu", ties=True)
