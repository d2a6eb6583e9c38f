"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3): GQA, RoPE, RMSNorm, SwiGLU.

Module names mirror the HF checkpoints so weights load by name, except the fused projections: q/k/v run as one
`qkv_proj` GEMM and gate/up as one `gate_up_proj` (the loader maps the checkpoint's tensors onto their rows).
Differences between the members: Qwen2 has q/k/v biases, Qwen3 normalizes q and k per head, Llama-3 scales RoPE
frequencies.

Per layer, the elementwise work runs as fused kernels (`LayerKernels`, Triton on CUDA, torch elsewhere): residual
add + RMSNorm, q/k norm + RoPE + paged K/V store, SiLU-and-mul. The residual stream is carried beside the hidden
states, so `x + attn(norm(x))` becomes `norm(attn_out + residual)` with the sum kept as the next residual.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.layers.kernels import LayerKernels
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import Linear, LinearMethod, StackedLinear
from engine.layers.quant.unquantized import UnquantizedLinearMethod
from engine.layers.rotary_embedding import cos_sin_cache
from engine.models.arch_config import ArchConfig


class LlamaAttention(nn.Module):
    def __init__(
        self, cfg: ArchConfig, kernels: LayerKernels, backend: AttentionBackend, linear_method: LinearMethod
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = StackedLinear(
            cfg.hidden_size,
            ("q_proj", "k_proj", "v_proj"),
            (q_size, kv_size, kv_size),
            cfg.attention_bias,
            linear_method,
        )
        o_bias = cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM"
        self.o_proj = Linear(q_size, cfg.hidden_size, o_bias, linear_method)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, kernels) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, kernels) if cfg.qk_norm else None
        self.eps = cfg.rms_norm_eps
        self.kernels = kernels
        self.backend = backend

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        cos_sin: torch.Tensor,
    ) -> torch.Tensor:
        q = self.kernels.qk_norm_rope_store(
            self.qkv_proj(x),
            positions,
            cos_sin,
            None if self.q_norm is None else self.q_norm.weight,
            None if self.k_norm is None else self.k_norm.weight,
            self.eps,
            kv_cache,
            metadata.slot_mapping,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
        )
        out = self.backend.forward(q, kv_cache, metadata)
        return self.o_proj(out.view(out.shape[0], self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ArchConfig, kernels: LayerKernels, linear_method: LinearMethod) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = StackedLinear(
            cfg.hidden_size, ("gate_proj", "up_proj"), (size, size), cfg.mlp_bias, linear_method
        )
        self.down_proj = Linear(size, cfg.hidden_size, cfg.mlp_bias, linear_method)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, cfg: ArchConfig, kernels: LayerKernels, backend: AttentionBackend, linear_method: LinearMethod
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, kernels, backend, linear_method)
        self.mlp = LlamaMLP(cfg, kernels, linear_method)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output (or the embeddings, with residual None) -> (MLP output, residual)."""
        if residual is None:
            hidden, residual = self.input_layernorm(x), x
        else:
            hidden, residual = self.input_layernorm.add_and_norm(x, residual)
        attn_out = self.self_attn(positions, hidden, kv_cache, metadata, cos_sin)
        hidden, residual = self.post_attention_layernorm.add_and_norm(attn_out, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ArchConfig, kernels: LayerKernels, backend: AttentionBackend, linear_method: LinearMethod
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.cos_sin: torch.Tensor
        self.register_buffer(
            "cos_sin",
            cos_sin_cache(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling),
            persistent=False,
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, kernels, backend, linear_method) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, metadata, self.cos_sin)
        assert residual is not None
        return self.norm.add_and_norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Serves every architecture in `arch_config.SUPPORTED_ARCHITECTURES`. The decoder's projections run
    `linear_method` (the quantization's); the embedding and lm_head stay in the model dtype."""

    def __init__(
        self, cfg: ArchConfig, kernels: LayerKernels, backend: AttentionBackend, linear_method: LinearMethod
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, kernels, backend, linear_method)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, UnquantizedLinearMethod(kernels))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
