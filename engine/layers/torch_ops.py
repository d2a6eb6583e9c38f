"""The torch set of the layer kernels (the twin of the `triton_*.py` files): RMSNorm, residual add + RMSNorm,
SwiGLU's SiLU-and-mul, and the fused q/k RMSNorm + RoPE + paged K/V store. `engine.layers.kernels` picks this set
off CUDA; the Triton set is checked against it.

RMSNorm semantics (Hugging Face's): `x * rsqrt(mean(x^2) + eps)` in float32, rounded to the input dtype, THEN
multiplied by the weight in the input dtype. The residual add rounds to the input dtype first, as
`x = x + attn_out` does. RoPE is neox style, on the cos/sin cache that `engine.layers.rotary_embedding` builds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.backend import store_kv


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of any shape; float64 inputs stay float64 (for error references)."""
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    x_acc = x.to(compute_dtype)
    x_acc = x_acc * torch.rsqrt(x_acc.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x_acc.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2 * I] (gate columns first, then up) -> silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] through the gate_up weight [2 * I, K] (gate rows, then up rows), then `silu_and_mul` -> [T, I]."""
    return silu_and_mul(F.linear(x, weight, bias))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Split qkv [T, (Hq + 2 * Hkv) * D]; RMSNorm q and k per head (when both weights are given), rotate them by
    positions [T], store k and v into kv_cache [num_blocks, 2, block_size, Hkv, D] at slot_mapping [T] (slots < 0
    are skipped) and return q [T, Hq, D]. cos/sin are rounded to the activation dtype before use.

    NOTE: skipping slots < 0 takes a boolean index (a host sync): fine here, the CUDA kernel does it in place.
    """
    num_tokens = qkv.shape[0]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    q = q.view(num_tokens, num_heads, head_dim)
    k = k.view(num_tokens, num_kv_heads, head_dim)
    v = v.view(num_tokens, num_kv_heads, head_dim)
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    cos, sin = cos_sin[positions].to(q.dtype).chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), dim=-1).unsqueeze(1), torch.cat((sin, sin), dim=-1).unsqueeze(1)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    stored = slot_mapping >= 0
    store_kv(k[stored], v[stored], kv_cache, slot_mapping[stored], kv_cache.shape[2])
    return q
