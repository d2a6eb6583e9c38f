"""The cos/sin cache of rotary position embedding (neox style, as in Llama/Qwen), with Llama-3 frequency scaling.
The rotation itself is a layer kernel (`engine.layers.torch_ops`, `triton_rope`).

The cos/sin cache is float32 [max_position, D]: row p holds cos(p * inv_freq) for the D/2 frequencies, then
sin(p * inv_freq).
"""

from __future__ import annotations

import math
from typing import Any

import torch


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
