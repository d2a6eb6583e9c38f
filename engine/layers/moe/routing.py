"""Top-k gating: which experts each token goes to, and with what weight."""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, top_k] float32, expert ids [T, top_k] int64).

    Softmax over all experts (in float32), then the top k; with `renormalize` the k weights are divided by their
    sum (Mixtral; Qwen3-MoE where the checkpoint's `norm_topk_prob` says so). Ties go as `torch.topk` breaks them
    (transformers routes with the same call; torch promises no order among ties).
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
