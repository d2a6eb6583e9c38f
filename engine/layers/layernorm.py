"""The RMSNorm module, which runs the device's kernel set (semantics: `engine.layers.torch_ops`)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.kernels import LayerKernels


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
