"""Float weights in the model dtype, run on the device's kernel set (the bf16 one-row GEMV on CUDA)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.layers.kernels import LayerKernels
from engine.layers.linear import Linear, LinearMethod
from engine.layers.quant.base import QuantMethod


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self, kernels: LayerKernels) -> None:
        self.kernels = kernels

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, layer.weight, layer.bias)

    def apply_silu_and_mul(
        self, layer: Linear, x: torch.Tensor, silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        return self.kernels.linear_silu_and_mul(x, layer.weight, layer.bias)


class Unquantized(QuantMethod):
    name = "none"

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return unquantized
