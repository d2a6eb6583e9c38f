"""The kernels a model layer runs beside cuBLAS, chosen once per device: Triton on CUDA, torch elsewhere (fused
elementwise work, and a one-row GEMV for batch-1 decode).

Both sets compute the same functions (`engine.layers.torch_ops` documents the semantics;
tests/engine/test_triton_layers.py checks the Triton set against the torch one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.layers import torch_ops
from engine.layers.moe import torch_moe


@dataclass(frozen=True, slots=True)
class LayerKernels:
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    fused_add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    # (qkv, positions, cos_sin, q_norm_weight, k_norm_weight, eps, kv_cache, slot_mapping, Hq, Hkv, D) -> q
    qk_norm_rope_store: Callable[..., torch.Tensor]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    # (x, weight, bias | None) -> x @ weight^T + bias
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    # (x, gate_up weight, bias | None) -> silu_and_mul(linear(x, weight, bias)), one launch at batch 1 on CUDA
    linear_silu_and_mul: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    # (x, router_logits, w13, w2, top_k, renormalize, first_expert, sync) -> the MoE layer's output
    # (engine.layers.moe; sync: `moe_sync_counters`)
    moe: Callable[..., torch.Tensor] = torch_moe.moe


def moe_sync_counters(hidden_size: int) -> torch.Tensor:
    """Zero int32 counters for one MoE layer's decode launches on CUDA (engine.layers.triton_sync): one per 16
    output columns of up to 16 tokens, for the pairs' sum in the down projection's launch."""
    return torch.zeros(hidden_size, dtype=torch.int32)


def layer_kernels(device: torch.device, pdl: bool = False) -> LayerKernels:
    """The set for `device`; `pdl`: the Triton norms and the q/k norm + RoPE + store launch early (for a model whose
    one-row GEMVs do, `LinearMethod.gemv_pdl`)."""
    if device.type == "cuda":
        from engine.layers.moe.triton_moe import moe as triton_moe
        from engine.layers.triton_activation import silu_and_mul as triton_silu_and_mul
        from engine.layers.triton_gemv import linear as triton_linear
        from engine.layers.triton_gemv import linear_silu_and_mul as triton_linear_silu_and_mul
        from engine.layers.triton_rms_norm import fused_add_rms_norm as triton_fused_add_rms_norm
        from engine.layers.triton_rms_norm import rms_norm as triton_rms_norm
        from engine.layers.triton_rope import qk_norm_rope_store as triton_qk_norm_rope_store

        return LayerKernels(
            functools.partial(triton_rms_norm, pdl=pdl),
            functools.partial(triton_fused_add_rms_norm, pdl=pdl),
            functools.partial(triton_qk_norm_rope_store, pdl=pdl),
            triton_silu_and_mul,
            triton_linear,
            triton_linear_silu_and_mul,
            triton_moe,
        )
    return LayerKernels(
        torch_ops.rms_norm,
        torch_ops.fused_add_rms_norm,
        torch_ops.qk_norm_rope_store,
        torch_ops.silu_and_mul,
        F.linear,
        torch_ops.linear_silu_and_mul,
    )
