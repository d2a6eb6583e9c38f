"""Rotary position embedding (neox style, as in Llama/Qwen), with Llama-3 frequency scaling, and the torch version
of the fused q/k RMSNorm + RoPE + paged K/V store that the attention layers run.

The cos/sin cache is float32 [max_position, D]: row p holds cos(p * inv_freq) for the D/2 frequencies, then
sin(p * inv_freq).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.attention.backend import store_kv
from engine.layers.layernorm import rms_norm


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama-3.1 rope scaling: long wavelengths slowed by `factor`, a smooth ramp in between."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def cos_sin_cache(head_dim: int, max_position: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The float32 [max_position, head_dim] table the q/k RoPE kernels read (see the module docstring)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "llama3":
        assert scaling is not None
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    elif rope_type != "default":
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (default, llama3)")
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=1)


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
