"""The torch reference of the expert computation: one pass per expert over the tokens routed to it, in expert order
(as transformers computes it, so that float32 sums round the same way). Data-dependent shapes: not for CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.moe.routing import select_experts


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    first_expert: int,
) -> torch.Tensor:
    """sum_j topk_weights[t, j] * down(silu(gate(x_t)) * up(x_t)) over the experts this device holds.

    x [T, H]; w13 [E_local, 2I, H] (gate rows, then up rows); w2 [E_local, H, I]; topk_weights [T, k];
    topk_ids [T, k], global expert ids, expert `first_expert + e` held at w13[e] (others contribute nothing).
    Returns [T, H] in x's dtype.
    """
    out = torch.zeros_like(x)
    local = topk_ids - first_expert
    for expert in torch.unique(local).tolist():
        if not 0 <= expert < w13.shape[0]:
            continue
        token, slot = torch.where(local == expert)
        gate, up = F.linear(x[token], w13[expert]).chunk(2, dim=-1)
        hidden = F.linear(F.silu(gate) * up, w2[expert]) * topk_weights[token, slot, None]
        out.index_add_(0, token, hidden.to(out.dtype))
    return out


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
    """The MoE layer after its router: each token's `top_k` experts from `router_logits` [T, num_experts]
    (`routing.select_experts`), then `fused_moe`. `sync` (the CUDA kernels' counters) is not used."""
    return fused_moe(x, w13, w2, *select_experts(router_logits, top_k, renormalize), first_expert)
