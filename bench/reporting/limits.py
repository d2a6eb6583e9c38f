"""What a step must read or compute: the figures reported as a ratio of the physical limits that
engine.tuning.limits measures on the machine at hand."""

from __future__ import annotations

from engine.models.arch_config import ArchConfig
from engine.models.llama import LlamaForCausalLM


def decode_bytes_per_step(model: LlamaForCausalLM, kv_bytes_per_token: int, context_len: int) -> int:
    """Bytes one batch-1 decode step must read: every weight but the embedding table (one row), plus KV. (A tied
    lm_head reads the table; one that `quantize_lm_head` quantized is a weight of its own.)"""
    assert model.lm_head is not None and model.model.embed_tokens is not None
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    weights = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if tied or not name.endswith("embed_tokens.weight")
    )
    return weights + kv_bytes_per_token * context_len


def prefill_flops(num_params_no_embed: int, num_layers: int, num_heads: int, head_dim: int, tokens: int) -> float:
    """Dense matmul FLOPs of a causal prefill: 2 * params * tokens + causal attention (QK^T and PV)."""
    return 2.0 * num_params_no_embed * tokens + 2.0 * num_layers * num_heads * head_dim * tokens * tokens


def active_decode_bytes_per_step(arch: ArchConfig, dtype_bytes: int, context_len: int) -> int:
    """Bytes one batch-1 decode step must read, from the architecture alone (any model, MoE included, however it is
    split over devices): the attention and dense MLP weights, the router and the top-k experts of each MoE layer
    (the other experts stay unread), the lm_head, one embedding row, and the KV of `context_len` tokens."""
    q_size, kv_size = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    params = arch.num_layers * arch.hidden_size * (2 * q_size + 2 * kv_size)
    sparse = arch.moe.sparse_layers if arch.moe is not None else ()
    params += (arch.num_layers - len(sparse)) * 3 * arch.hidden_size * arch.intermediate_size
    if arch.moe is not None:
        expert = 3 * arch.hidden_size * arch.moe.moe_intermediate_size
        params += len(sparse) * (arch.moe.num_experts * arch.hidden_size + arch.moe.num_experts_per_tok * expert)
    params += (arch.vocab_size + 1) * arch.hidden_size
    kv_per_token = 2 * arch.num_layers * kv_size
    return (params + kv_per_token * context_len) * dtype_bytes
