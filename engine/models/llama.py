"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, and the MoE Qwen3-MoE and Mixtral): GQA, RoPE, RMSNorm,
SwiGLU, or in a mixture-of-experts model's sparse layers the expert block (`engine.models.moe`).

Module names mirror the HF checkpoints so weights load by name, except the fused projections: q/k/v run as one
`qkv_proj` GEMM and gate/up as one `gate_up_proj` (the loader maps the checkpoint's tensors onto their rows).
Differences between the members: Qwen2 has q/k/v biases, Qwen3 normalizes q and k per head, Llama-3 scales RoPE
frequencies.

Per layer, the elementwise work runs as fused kernels (`LayerKernels`, Triton on CUDA, torch elsewhere): residual
add + RMSNorm, q/k norm + RoPE + paged K/V store, SiLU-and-mul (inside the gate_up GEMV's launch at batch 1 where the
weight format has that kernel: `LinearMethod.apply_silu_and_mul`). The residual stream is carried beside the hidden
states, so `x + attn(norm(x))` becomes `norm(attn_out + residual)` with the sum kept as the next residual.

Tensor parallelism (`engine.parallel.layers`): q/k/v and gate/up are column-parallel (each rank holds its heads and
intermediate rows), o_proj and down_proj row-parallel (an all-reduce sums the ranks' parts), the embedding and
lm_head vocab-parallel. Pipeline parallelism: a stage holds its range of layers (the others are empty
placeholders, so parameter names keep the checkpoint's layer numbers); the first stage embeds, the others receive
the hidden states and residual from the previous stage, and every stage but the last passes them on.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.layers.kernels import LayerKernels
from engine.layers.layernorm import RMSNorm
from engine.layers.linear import LinearMethod
from engine.layers.rotary_embedding import cos_sin_cache
from engine.models.arch_config import ArchConfig
from engine.models.moe import SparseMoeBlock
from engine.parallel.communicator import SINGLE_RANK, Communicator
from engine.parallel.layers import (
    ParallelLMHead,
    RowParallelLinear,
    StackedColumnParallelLinear,
    VocabParallelEmbedding,
)


def _rows(heads: slice, head_dim: int) -> slice:
    return slice(heads.start * head_dim, heads.stop * head_dim)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        cfg: ArchConfig,
        kernels: LayerKernels,
        backend: AttentionBackend,
        linear_method: LinearMethod,
        comm: Communicator,
    ) -> None:
        super().__init__()
        heads, kv_heads = comm.rank.split(cfg.num_heads), comm.rank.kv_heads(cfg.num_kv_heads)
        self.num_heads, self.num_kv_heads = heads.stop - heads.start, kv_heads.stop - kv_heads.start
        self.head_dim = cfg.head_dim
        kv_rows = _rows(kv_heads, cfg.head_dim)
        self.qkv_proj = StackedColumnParallelLinear(
            cfg.hidden_size,
            ("q_proj", "k_proj", "v_proj"),
            (_rows(heads, cfg.head_dim), kv_rows, kv_rows),
            cfg.attention_bias,
            linear_method,
        )
        o_bias = cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM"
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, o_bias, linear_method, comm)
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
    def __init__(self, cfg: ArchConfig, kernels: LayerKernels, linear_method: LinearMethod, comm: Communicator) -> None:
        super().__init__()
        rows = comm.rank.split(cfg.intermediate_size)
        self.gate_up_proj = StackedColumnParallelLinear(
            cfg.hidden_size, ("gate_proj", "up_proj"), (rows, rows), cfg.mlp_bias, linear_method
        )
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, linear_method, comm)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.forward_silu_and_mul(x, self.kernels.silu_and_mul))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ArchConfig,
        kernels: LayerKernels,
        backend: AttentionBackend,
        linear_method: LinearMethod,
        comm: Communicator,
        layer_index: int,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, kernels, backend, linear_method, comm)
        self.mlp: nn.Module
        if cfg.moe is not None and layer_index in cfg.moe.sparse_layers:
            self.mlp = SparseMoeBlock(cfg.moe, cfg.hidden_size, kernels, comm)
        else:
            self.mlp = LlamaMLP(cfg, kernels, linear_method, comm)
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
    """`host_layers`: decoder layers built in host memory whatever the device (`cpu_offload_gb`:
    engine.kv_tier.weight_offload streams their weights to the device)."""

    def __init__(
        self,
        cfg: ArchConfig,
        kernels: LayerKernels,
        backend: AttentionBackend,
        linear_method: LinearMethod,
        comm: Communicator,
        host_layers: range = range(0),
    ) -> None:
        super().__init__()
        self.comm = comm
        self.hidden_size, self.dtype = cfg.hidden_size, torch.get_default_dtype()
        rank = comm.rank
        self.embed_tokens = (
            VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, comm) if rank.is_first_stage else None
        )
        self.cos_sin: torch.Tensor
        self.register_buffer(
            "cos_sin",
            cos_sin_cache(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling),
            persistent=False,
        )
        self.stage_layers = rank.stage_layers(cfg.num_layers)
        self.host_layers = host_layers
        self.layers = nn.ModuleList()
        for i in range(cfg.num_layers):
            if i not in self.stage_layers:
                self.layers.append(nn.Module())
                continue
            with torch.device("cpu") if i in host_layers else contextlib.nullcontext():
                self.layers.append(LlamaDecoderLayer(cfg, kernels, backend, linear_method, comm, i))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels) if rank.is_last_stage else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """kv_caches: this stage's layers' caches; `inputs_embeds` (first stage): the embeddings to run instead of
        input_ids' (a prompt's image placeholders). On the last stage the normed hidden states, on the others the
        hidden states just sent on."""
        residual: torch.Tensor | None = None
        if inputs_embeds is not None:
            x = inputs_embeds
        elif self.embed_tokens is not None:
            x = self.embed_tokens(input_ids)
        else:
            like = torch.empty(input_ids.shape[0], self.hidden_size, dtype=self.dtype, device=input_ids.device)
            x, residual = self.comm.recv_from_previous_stage(2, like)
        layers = self.layers[self.stage_layers.start : self.stage_layers.stop]
        for layer, kv_cache in zip(layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, metadata, self.cos_sin)
        assert residual is not None
        if self.norm is None:
            self.comm.send_to_next_stage((x, residual))
            return x
        return self.norm.add_and_norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Serves every architecture in `arch_config.SUPPORTED_ARCHITECTURES`. The decoder's projections run
    `linear_method` (the quantization's), the lm_head `head_method`; the embedding stays in
    the model dtype (a tied lm_head that a method quantizes gets its own copy). `comm` places the model on its rank
    (default: the whole model on one device); `host_layers` are built in host memory (`LlamaModel`)."""

    def __init__(
        self,
        cfg: ArchConfig,
        kernels: LayerKernels,
        backend: AttentionBackend,
        linear_method: LinearMethod,
        head_method: LinearMethod,
        comm: Communicator = SINGLE_RANK,
        host_layers: range = range(0),
    ) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, kernels, backend, linear_method, comm, host_layers)
        self.lm_head: ParallelLMHead | None = None
        if comm.rank.is_last_stage:
            self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, False, head_method, comm)
            if cfg.tie_word_embeddings and self.model.embed_tokens is not None:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] (or inputs_embeds [T, hidden] for input_ids) -> hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, metadata, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Every rank of the last stage gets all logits [T, vocab]."""
        assert self.lm_head is not None, "only the last pipeline stage computes logits"
        return self.lm_head(hidden)
