"""Linear layers that run through the device's kernel set (a one-row GEMV kernel on CUDA, F.linear elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.kernels import LayerKernels


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool, kernels: LayerKernels) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.weight, self.bias)


class StackedLinear(Linear):
    """Several checkpoint projections side by side (q|k|v, gate|up), run as one GEMM: rows of the weight (and bias)
    are the shards `shard_names` in order, `shard_sizes` rows each."""

    def __init__(
        self,
        in_features: int,
        shard_names: tuple[str, ...],
        shard_sizes: tuple[int, ...],
        bias: bool,
        kernels: LayerKernels,
    ) -> None:
        super().__init__(in_features, sum(shard_sizes), bias, kernels)
        self.shard_names = shard_names
        self.shard_sizes = shard_sizes

    def shard_rows(self, shard_name: str) -> slice:
        """The weight rows that hold the checkpoint projection `shard_name`."""
        index = self.shard_names.index(shard_name)
        start = sum(self.shard_sizes[:index])
        return slice(start, start + self.shard_sizes[index])

    def shards(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """`tensor` (the weight or the bias) split into its shards, by name (views)."""
        return dict(zip(self.shard_names, tensor.split(list(self.shard_sizes)), strict=True))
