# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The expert computation as two grouped GEMMs in Triton, over the pairs `align.align_by_expert` sorted by expert (or,
for a handful of pairs, one pair per block, read from the routing directly).

1. `_gate_up_kernel`: for each block of one expert's pairs and a tile of the intermediate columns, the gate and up
   tiles of `x @ w13[e]^T` side by side, then silu(gate) * up -> act [pairs, I].
2. `_down_kernel`: `act @ w2[e]^T` times each pair's routing weight -> out [pairs, H] (pairs of experts on other
   ranks stay zero).
3. The k pairs of each token summed in float32 -> [T, H]: with one pair per block and sync counters, by the last of
   a token's k programs on each column tile, inside the down kernel's launch (engine.layers.triton_sync; 9.5 us
   against 8.4 + 2.0 for the two launches at batch 1 on an H200), else by `_sum_pairs_kernel` (one launch; torch's
   sum and cast were two, ~5 us).

The tiles and the pairs' blocks are chosen in `launch`.
Same semantics as `torch_moe.fused_moe`; no host sync, so the whole layer is captured in decode CUDA graphs. `moe`
routes first (`triton_routing`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.moe import triton_routing
from engine.layers.moe.launch import MoETiles, PairBlocks, Tiles, moe_tiles, pair_blocks
from engine.layers.triton_sync import last_to_arrive


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
    summed_ptr,
    sync_ptr,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PAIR_PER_BLOCK: tl.constexpr,
    SUM_PAIRS: tl.constexpr,
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
    if SUM_PAIRS:
        # NOTE: one pair per block: the last of a token's top_k programs on these columns sums the token's pairs.
        token = pid_m // TOP_K
        if last_to_arrive(sync_ptr + token * tl.num_programs(1) + pid_n, TOP_K):
            _sum_token_pairs(out_ptr, summed_ptr, token, cols, col_mask, hidden_size, TOP_K, ".cg")


@triton.jit
def _sum_token_pairs(pairs_ptr, out_ptr, token, cols, mask, hidden_size, TOP_K: tl.constexpr, CACHE: tl.constexpr):
    """out[token, cols] = the sum of pairs[token * k .. token * k + k - 1] in float32, in slot order, in out's
    dtype (pairs and out [., hidden_size], contiguous)."""
    row = pairs_ptr + token.to(tl.int64) * TOP_K * hidden_size + cols
    total = tl.zeros(cols.shape, dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(row + slot * hidden_size, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * hidden_size + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_pairs_kernel(pairs_ptr, out_ptr, hidden_size, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token, tile = tl.program_id(0), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    _sum_token_pairs(pairs_ptr, out_ptr, token, cols, cols < hidden_size, hidden_size, TOP_K, "")


def _precision(dtype: torch.dtype) -> str:
    # NOTE: float32 models (the oracle runs) multiply in full precision; tf32 only matters for float32 inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def run_gate_up(x: torch.Tensor, w13: torch.Tensor, pairs: PairBlocks, tiles: Tiles) -> torch.Tensor:
    """act [pairs, I] = silu(x @ gate^T) * (x @ up^T) of each pair's token and expert."""
    num_experts, two_i, hidden = w13.shape
    intermediate = two_i // 2
    act = torch.empty(pairs.num_pairs, intermediate, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(pairs.num_blocks, triton.cdiv(intermediate, tiles.block_n))](
        x,
        w13,
        act,
        pairs.sorted_pair_ids,
        pairs.block_expert_ids,
        pairs.expert_offset,
        num_experts,
        pairs.num_pairs,
        pairs.top_k,
        hidden,
        intermediate,
        x.stride(0),
        *w13.stride(),
        act.stride(0),
        BLOCK_M=pairs.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        DOT_PRECISION=_precision(x.dtype),
        PAIR_PER_BLOCK=pairs.pair_per_block,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return act


def run_down(
    act: torch.Tensor,
    w2: torch.Tensor,
    pair_weights: torch.Tensor,
    pairs: PairBlocks,
    tiles: Tiles,
    sync: torch.Tensor | None = None,
) -> torch.Tensor:
    """[T, H]: each token's sum over its k pairs of act @ w2[expert]^T times the pair's routing weight (float32
    `pair_weights` [pairs]), each pair rounded to act's dtype, then summed in float32 in slot order; the pairs of
    experts this rank does not hold are zero. With one pair per block and `sync` (zero int32 counters, one per
    token and N tile: engine.layers.triton_sync) the sum happens in the same launch, else in one more."""
    num_experts, hidden, intermediate = w2.shape
    num_tokens, col_tiles = pairs.num_pairs // pairs.top_k, triton.cdiv(hidden, tiles.block_n)
    fused_sum = pairs.pair_per_block and sync is not None and sync.numel() >= num_tokens * col_tiles
    alloc = torch.empty if pairs.pair_per_block else torch.zeros
    out = alloc(pairs.num_pairs, hidden, dtype=act.dtype, device=act.device)
    summed = torch.empty(num_tokens, hidden, dtype=act.dtype, device=act.device)
    _down_kernel[(pairs.num_blocks, col_tiles)](
        act,
        w2,
        out,
        pair_weights,
        pairs.sorted_pair_ids,
        pairs.block_expert_ids,
        pairs.expert_offset,
        num_experts,
        pairs.num_pairs,
        hidden,
        intermediate,
        act.stride(0),
        *w2.stride(),
        out.stride(0),
        summed,
        sync if fused_sum else out,  # NOTE: any pointer where SUM_PAIRS is off (the kernel never reads it)
        TOP_K=pairs.top_k,
        BLOCK_M=pairs.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        DOT_PRECISION=_precision(act.dtype),
        PAIR_PER_BLOCK=pairs.pair_per_block,
        SUM_PAIRS=fused_sum,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if not fused_sum:
        grid = (num_tokens, triton.cdiv(hidden, 1024))
        _sum_pairs_kernel[grid](out, summed, hidden, TOP_K=pairs.top_k, BLOCK=1024)
    return summed


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
    tiles: MoETiles | None = None,
    sync: torch.Tensor | None = None,
) -> torch.Tensor:
    """`torch_moe.fused_moe` in two Triton grouped GEMMs (same arguments, same result up to rounding); `tiles`: the
    launches, `moe_tiles`' by default; `sync`: zero int32 counters for `run_down`."""
    _check(x, w13, w2, topk_weights, topk_ids)
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    tiles = tiles or moe_tiles(num_tokens * top_k, w13.shape[0], x.dtype)
    pairs = pair_blocks(topk_ids, w13.shape[0], first_expert, tiles.block_m)
    act = run_gate_up(x, w13, pairs, tiles.gate_up)
    pair_weights = topk_weights.to(torch.float32).flatten().contiguous()
    return run_down(act, w2, pair_weights, pairs, tiles.down, sync)


def moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    renormalize: bool,
    first_expert: int,
    sync: torch.Tensor | None = None,
) -> torch.Tensor:
    """`torch_moe.moe` on CUDA: the routing (`triton_routing`), then `fused_moe` (`sync`:
    `kernels.moe_sync_counters`, for the pairs' sum in the down projection's launch); [T, H] in x's dtype."""
    topk_weights, topk_ids = triton_routing.select_experts(router_logits, top_k, renormalize)
    return fused_moe(x, w13, w2, topk_weights, topk_ids, first_expert, sync=sync)
