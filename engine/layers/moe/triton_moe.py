# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The expert computation as two grouped GEMMs in Triton, over the pairs `align.align_by_expert` sorted by expert (or,
for a handful of pairs, one pair per block, read from the routing directly).

1. `_gate_up_kernel`: for each block of one expert's pairs and a tile of the intermediate columns, the gate and up
   tiles of `x @ w13[e]^T` side by side, then silu(gate) * up -> act [pairs, I].
2. `_down_kernel`: `act @ w2[e]^T` times each pair's routing weight -> out [pairs, H] (pairs of experts on other
   ranks stay zero).
3. `_sum_pairs_kernel`: the k pairs of each token summed in float32 -> [T, H] (one launch; torch's sum and cast were
   two, ~5 us at batch 1 on an H200).

Same semantics as `torch_moe.fused_moe`; no host sync, so the whole layer is captured in decode CUDA graphs. `moe`
routes first (`triton_routing`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.moe import triton_routing
from engine.layers.moe.align import align_by_expert


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w13_ptr,
    act_ptr,
    sorted_pair_ids_ptr,
    block_expert_ids_ptr,
    first_expert,
    num_local_experts,
    num_pairs,
    top_k,
    hidden_size,
    intermediate_size,
    stride_xt,
    stride_we,
    stride_wn,
    stride_wk,
    stride_at,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PAIR_PER_BLOCK: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ids_ptr + pid_m).to(tl.int32) - first_expert
    if (expert < 0) | (expert >= num_local_experts):
        return
    if PAIR_PER_BLOCK:
        pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
    else:
        pairs = tl.load(sorted_pair_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_mask = pairs < num_pairs
    tokens = pairs // top_k
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < intermediate_size
    w_expert = w13_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < hidden_size
        a = tl.load(
            x_ptr + tokens.to(tl.int64)[:, None] * stride_xt + ks[None, :],
            mask=pair_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w_mask = k_mask[:, None] & col_mask[None, :]
        w_gate = tl.load(w_expert + cols[None, :] * stride_wn + ks[:, None] * stride_wk, mask=w_mask, other=0.0)
        w_up = tl.load(
            w_expert + (cols + intermediate_size)[None, :] * stride_wn + ks[:, None] * stride_wk,
            mask=w_mask,
            other=0.0,
        )
        acc_gate = tl.dot(a, w_gate, acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PRECISION)
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    out = act_ptr + pairs.to(tl.int64)[:, None] * stride_at + cols[None, :]
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=pair_mask[:, None] & col_mask[None, :])


@triton.jit
def _down_kernel(
    act_ptr,
    w2_ptr,
    out_ptr,
    pair_weights_ptr,
    sorted_pair_ids_ptr,
    block_expert_ids_ptr,
    first_expert,
    num_local_experts,
    num_pairs,
    hidden_size,
    intermediate_size,
    stride_at,
    stride_we,
    stride_wn,
    stride_wk,
    stride_ot,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PAIR_PER_BLOCK: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ids_ptr + pid_m).to(tl.int32) - first_expert
    held = (expert >= 0) & (expert < num_local_experts)
    if PAIR_PER_BLOCK:
        # NOTE: a pair of another rank's expert writes its zeros (reading nothing), so `out` needs no zero fill.
        pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
    else:
        if (expert < 0) | (expert >= num_local_experts):
            return
        pairs = tl.load(sorted_pair_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_mask = pairs < num_pairs
    k_limit = tl.where(held, intermediate_size, 0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < hidden_size
    w_expert = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, intermediate_size, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < k_limit
        a = tl.load(
            act_ptr + pairs.to(tl.int64)[:, None] * stride_at + ks[None, :],
            mask=pair_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            w_expert + cols[None, :] * stride_wn + ks[:, None] * stride_wk,
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    acc *= tl.load(pair_weights_ptr + pairs, mask=pair_mask, other=0.0)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=pair_mask[:, None] & col_mask[None, :])


@triton.jit
def _sum_pairs_kernel(pairs_ptr, out_ptr, hidden_size, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = the sum of pairs[t * k .. t * k + k - 1] in float32, in slot order, in out's dtype."""
    token, tile = tl.program_id(0), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden_size
    row = pairs_ptr + token.to(tl.int64) * TOP_K * hidden_size + cols
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(row + slot * hidden_size, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * hidden_size + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


def block_config(num_pairs: int, num_local_experts: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) by the pairs an expert gets on average: small M tiles (and narrow N
    tiles, for more programs streaming the weights) at decode, wider ones for prefill."""
    per_expert = num_pairs / num_local_experts
    if per_expert <= 16:
        return 16, 32, 128, 4
    if per_expert <= 64:
        return 32, 64, 64, 4
    return 64, 128, 64, 8


def _check(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> None:
    num_experts, two_i, hidden = w13.shape
    if x.dim() != 2 or x.shape[1] != hidden or x.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} is not [T, {hidden}] with contiguous rows")
    if w2.shape != (num_experts, hidden, two_i // 2) or w2.dtype != w13.dtype or x.dtype != w13.dtype:
        raise ValueError(
            f"w2 {w2.dtype}{tuple(w2.shape)} does not match w13 {w13.dtype}{tuple(w13.shape)}, x {x.dtype}"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)} vs {x.shape[0]} tokens"
        )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    first_expert: int,
) -> torch.Tensor:
    """`torch_moe.fused_moe` in two Triton grouped GEMMs (same arguments, same result up to rounding)."""
    _check(x, w13, w2, topk_weights, topk_ids)
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, hidden = w13.shape
    intermediate = two_i // 2
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    block_m, block_n, block_k, num_warps = block_config(num_pairs, num_experts)
    # NOTE: a few pairs (batch-1 decode: top_k distinct experts) run one block each, straight from topk_ids: the
    # sort's dozen small launches per layer would cost more than the padding rows' wasted MACs.
    pair_per_block = num_pairs <= block_m
    if pair_per_block:
        pair_ids = topk_ids.contiguous()
        sorted_pair_ids, block_expert_ids, expert_offset, num_blocks = pair_ids, pair_ids, first_expert, num_pairs
    else:
        blocks = align_by_expert(topk_ids, num_experts, first_expert, block_m)
        sorted_pair_ids, block_expert_ids, expert_offset = blocks.sorted_pair_ids, blocks.block_expert_ids, 0
        num_blocks = block_expert_ids.shape[0]
    # NOTE: float32 models (the oracle runs) multiply in full precision; tf32 only matters for float32 inputs.
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    # NOTE: float32 tiles take twice the shared memory: two stages of the widest (gate + up) fit where three do not.
    launch = {"num_warps": num_warps, "num_stages": 2 if x.dtype == torch.float32 else 3}
    act = torch.empty(num_pairs, intermediate, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(num_blocks, triton.cdiv(intermediate, block_n))](
        x,
        w13,
        act,
        sorted_pair_ids,
        block_expert_ids,
        expert_offset,
        num_experts,
        num_pairs,
        top_k,
        hidden,
        intermediate,
        x.stride(0),
        *w13.stride(),
        act.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=precision,
        PAIR_PER_BLOCK=pair_per_block,
        **launch,
    )
    out = (torch.empty if pair_per_block else torch.zeros)(num_pairs, hidden, dtype=x.dtype, device=x.device)
    pair_weights = topk_weights.to(torch.float32).flatten().contiguous()
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        act,
        w2,
        out,
        pair_weights,
        sorted_pair_ids,
        block_expert_ids,
        expert_offset,
        num_experts,
        num_pairs,
        hidden,
        intermediate,
        act.stride(0),
        *w2.stride(),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=precision,
        PAIR_PER_BLOCK=pair_per_block,
        **launch,
    )
    summed = torch.empty_like(x)
    _sum_pairs_kernel[(num_tokens, triton.cdiv(hidden, 1024))](out, summed, hidden, TOP_K=top_k, BLOCK=1024)
    return summed


def moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    renormalize: bool,
    first_expert: int,
) -> torch.Tensor:
    """`torch_moe.moe` on CUDA: the routing (`triton_routing`), then `fused_moe`; [T, H] in x's dtype."""
    topk_weights, topk_ids = triton_routing.select_experts(router_logits, top_k, renormalize)
    return fused_moe(x, w13, w2, topk_weights, topk_ids, first_expert)
