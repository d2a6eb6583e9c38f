"""Float weights in the model dtype, run on the device's kernel set (the bf16 one-row GEMV on CUDA)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.layers.kernels import LayerKernels
from engine.layers.quant.base import LinearMethod, QuantMethod

if TYPE_CHECKING:
    from engine.layers.linear import Linear


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self, kernels: LayerKernels) -> None:
        self.kernels = kernels

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, layer.weight, layer.bias)


class Unquantized(QuantMethod):
    name = "none"

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return unquantized
