# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The MoE layer for a few tokens (batch-1 decode and small batches) in three launches after the router.

At batch 1 on Qwen3-30B-A3B (H200, 2026-11-28) the work around the grouped GEMMs cost nearly as much as the experts:
softmax, top-k (a sort and a gather), the renormalization, two dtype copies and the sum of the k pairs' outputs were
nine launches per layer, ~21 us of the layer's ~45. Here:
1. `_route_kernel`, one program (one warp) per token: softmax, top k and renormalization in registers.
2. `_gate_up_kernel`, one program per (pair, BLOCK_N intermediate rows): streams the pair's expert's gate and up rows
   against x and writes silu(gate) * up for its rows.
3. `_down_kernel`, one program per (token, BLOCK_N hidden rows): sums, in float32 over the token's k experts in slot
   order, weight_j * (act_j @ w2[e_j]^T) for its rows; written once, in x's dtype.
Routing inside every expert program (no launch of its own) cost more than it saved: each program waited ~20 us for
its k rounds of block-wide reductions before its first weight load.
Experts held by other expert-parallel ranks are skipped (their part is zero here). No host sync: the layer is
captured in the decode CUDA graphs.

Routing: the top k by logit (ties to the lower expert id), weighted by their softmax probability over all experts,
renormalized to sum 1 where the checkpoint says so: `routing.select_experts`, except that it ranks by probability,
so two logits whose float32 probabilities round equal go to the lower id there and to the larger logit here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class DecodeTiles:
    """Output columns per program of each kernel, the K step and the launch's warps and pipeline stages."""

    gate_up_cols: int = 32
    down_cols: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _route_kernel(
    logits_ptr,
    ids_ptr,
    weights_ptr,
    num_experts,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """One token's k experts (ids [T, k] int32, in rank order) and their weights ([T, k] float32)."""
    token = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + token.to(tl.int64) * num_experts + experts, mask=experts < num_experts)
    logits = tl.where(experts < num_experts, logits.to(tl.float32), -float("inf"))
    exps = tl.exp(logits - tl.max(logits, 0))
    probs = tl.math.div_rn(exps, tl.sum(exps, 0))
    slots = tl.arange(0, K_PAD)
    ids = tl.zeros(slots.shape, tl.int32)
    weights = tl.zeros(slots.shape, tl.float32)
    for slot in tl.static_range(TOP_K):
        best = tl.max(logits, 0)
        expert = tl.min(tl.where(logits == best, experts, BLOCK_E), 0)
        ids = tl.where(slots == slot, expert, ids)
        weights = tl.where(slots == slot, tl.sum(tl.where(experts == expert, probs, 0.0), 0), weights)
        logits = tl.where(experts == expert, -float("inf"), logits)
    if RENORMALIZE:
        weights = tl.math.div_rn(weights, tl.sum(weights, 0))
    tl.store(ids_ptr + token * TOP_K + slots, ids, mask=slots < TOP_K)
    tl.store(weights_ptr + token * TOP_K + slots, weights, mask=slots < TOP_K)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    ids_ptr,
    w13_ptr,
    act_ptr,
    first_expert,
    num_local_experts,
    hidden_size,
    intermediate_size,
    stride_xt,
    stride_we,
    stride_wn,
    stride_at,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pair, tile = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids_ptr + pair) - first_expert
    if (expert < 0) | (expert >= num_local_experts):
        return
    # NOTE: the MMA tile has 16 rows; only the first is this pair's (the others load nothing and are not stored).
    first_row = tl.arange(0, 16) == 0
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < intermediate_size
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xt + ks[None, :]
    gate_ptrs = w13_ptr + expert.to(tl.int64) * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
    up_ptrs = gate_ptrs + intermediate_size * stride_wn
    acc_gate = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        k_mask = k0 + ks < hidden_size
        a = tl.load(x_ptrs + k0, mask=first_row[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & col_mask[None, :]
        acc_gate = tl.dot(a, tl.load(gate_ptrs + k0, mask=w_mask, other=0.0), acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(a, tl.load(up_ptrs + k0, mask=w_mask, other=0.0), acc_up, input_precision=DOT_PRECISION)
    act = tl.math.div_rn(acc_gate, 1.0 + tl.exp(-acc_gate)) * acc_up
    out = act_ptr + pair.to(tl.int64) * stride_at + cols[None, :] + tl.zeros((16, 1), dtype=tl.int64)
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=first_row[:, None] & col_mask[None, :])


@triton.jit
def _down_kernel(
    act_ptr,
    ids_ptr,
    weights_ptr,
    w2_ptr,
    out_ptr,
    first_expert,
    num_local_experts,
    hidden_size,
    intermediate_size,
    stride_at,
    stride_we,
    stride_wn,
    stride_ot,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    token, tile = tl.program_id(0), tl.program_id(1)
    first_row = tl.arange(0, 16) == 0
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < hidden_size
    ks = tl.arange(0, BLOCK_K)
    k_steps = tl.cdiv(intermediate_size, BLOCK_K)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    # NOTE: one flat loop over (slot, K step), so the loads of the next expert's rows are in flight while this one's
    # last step multiplies; at each expert's last step its weighted part moves from `acc` into `total` (float32).
    for step in range(0, TOP_K * k_steps):
        slot = step // k_steps
        k0 = (step - slot * k_steps) * BLOCK_K
        pair = token * TOP_K + slot
        expert = tl.load(ids_ptr + pair) - first_expert
        # NOTE: an expert of another rank reads nothing (an empty K range) and adds zeros.
        k_mask = k0 + ks < tl.where((expert >= 0) & (expert < num_local_experts), intermediate_size, 0)
        a_ptrs = act_ptr + pair.to(tl.int64) * stride_at + k0 + ks[None, :]
        a = tl.load(a_ptrs, mask=first_row[:, None] & k_mask[None, :], other=0.0)
        w_ptrs = w2_ptr + expert.to(tl.int64) * stride_we + cols[None, :].to(tl.int64) * stride_wn + (k0 + ks)[:, None]
        w = tl.load(w_ptrs, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        last = k0 + BLOCK_K >= intermediate_size
        total += tl.where(last, tl.load(weights_ptr + pair), 0.0) * acc
        acc = tl.where(last, 0.0, acc)
    out = out_ptr + token.to(tl.int64) * stride_ot + cols[None, :] + tl.zeros((16, 1), dtype=tl.int64)
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=first_row[:, None] & col_mask[None, :])


def moe_decode(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    renormalize: bool,
    first_expert: int,
    tiles: DecodeTiles = DecodeTiles(),
) -> torch.Tensor:
    """`torch_moe.fused_moe(x, w13, w2, *routing.select_experts(router_logits, top_k, renormalize), first_expert)`
    for a few tokens: x [T, H] (rows contiguous), router_logits [T, num_experts], w13 [E_local, 2I, H] and w2
    [E_local, H, I] with contiguous rows. Returns [T, H] in x's dtype."""
    num_tokens, hidden = x.shape
    num_local, two_i, _ = w13.shape
    intermediate = two_i // 2
    num_experts = router_logits.shape[1]
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1 or router_logits.shape[0] != num_tokens:
        raise ValueError(
            f"x {tuple(x.shape)}, router_logits {tuple(router_logits.shape)}, w13, w2: rows must be contiguous and "
            "the logits one row per token"
        )
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    # NOTE: one warp: the k rounds of reductions over the experts stay in warp shuffles (no shared-memory barriers).
    _route_kernel[(num_tokens,)](
        router_logits.contiguous(),
        ids,
        weights,
        num_experts,
        TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_E=triton.next_power_of_2(num_experts),
        RENORMALIZE=renormalize,
        num_warps=1,
    )
    # NOTE: float32 models (the oracle runs) multiply in full precision; tf32 only matters for float32 inputs.
    blocks = {
        "TOP_K": top_k,
        "BLOCK_K": tiles.block_k,
        "DOT_PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
    }
    act = torch.empty(num_tokens * top_k, intermediate, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(num_tokens * top_k, triton.cdiv(intermediate, tiles.gate_up_cols))](
        x,
        ids,
        w13,
        act,
        first_expert,
        num_local,
        hidden,
        intermediate,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        BLOCK_N=tiles.gate_up_cols,
        **blocks,
    )
    out = torch.empty_like(x)
    _down_kernel[(num_tokens, triton.cdiv(hidden, tiles.down_cols))](
        act,
        ids,
        weights,
        w2,
        out,
        first_expert,
        num_local,
        hidden,
        intermediate,
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        BLOCK_N=tiles.down_cols,
        **blocks,
    )
    return out
