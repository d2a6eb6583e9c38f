"""RMSNorm, computed in float32 like the reference implementation, with the residual add fused in front.

Semantics (Hugging Face's): `x * rsqrt(mean(x^2) + eps)` in float32, rounded to the input dtype, THEN multiplied
by the weight in the input dtype. The residual add rounds to the input dtype first, as `x = x + attn_out` does.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.kernels import LayerKernels


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


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, kernels: LayerKernels) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(x + residual), x + residual), in one kernel."""
        return self.kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
