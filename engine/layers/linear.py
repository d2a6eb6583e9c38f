"""Linear layers whose weights a `LinearMethod` creates, finishes after loading and applies.

The method is chosen once, at model build, from `quantization` (`engine.layers.quant`): the model code names no
format. The unquantized method runs the device's kernel set (a one-row GEMV kernel on CUDA, F.linear elsewhere).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from engine.layers.weight_init import initialized


class LinearMethod(ABC):
    """How a `Linear` stores and runs its weight."""

    input_params: tuple[str, ...] = ()
    """Parameters indexed by input channel, not output row: every shard of a `StackedLinear` loads the whole of
    each (the shards must agree), e.g. an act-order input permutation."""
    gemv_pdl: bool = False
    """Whether its one-row GEMVs launch early (PDL, engine.layers.pdl): the model's norms, q/k norm + RoPE and
    decode attention then launch early too (measured on the 8B shape: W1 GPTQ 2.94 -> 2.83 ms; around GEMVs that
    do not launch early, fp8 and bf16, the same launches cost 0.04 ms)."""

    def create_weights(self, layer: Linear) -> None:
        """Register the parameters a checkpoint loads into; default: a float `weight` [out, in] in the default dtype,
        initialized as nn.Linear does (random-weight models run on it; a checkpoint load skips it: weight_init)."""
        weight = initialized(
            torch.empty(layer.out_features, layer.in_features),
            lambda w: torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)),
        )
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)

    def process_weights_after_loading(self, layer: Linear) -> None:  # noqa: B027 (optional hook)
        """Turn the loaded parameters into the ones `apply` reads (default: nothing to do)."""

    @abstractmethod
    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out], bias included."""

    def apply_silu_and_mul(
        self, layer: Linear, x: torch.Tensor, silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """SwiGLU on a gate_up layer (gate rows, then up rows): `silu_and_mul(apply(layer, x))` [T, out / 2]; a method
        with a kernel that does both in one launch overrides it, with the same result."""
        return silu_and_mul(self.apply(layer, x))


class Linear(nn.Module):
    weight: torch.Tensor
    """The weight as `method` stores it (e.g. int8 [out, in] beside a `weight_scale`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, method: LinearMethod) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.method = method
        self.bias: nn.Parameter | None = None
        method.create_weights(self)
        if bias:
            bound = in_features**-0.5
            bias_init = initialized(torch.empty(out_features), lambda b: b.uniform_(-bound, bound))
            self.bias = nn.Parameter(bias_init, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def forward_silu_and_mul(
        self, x: torch.Tensor, silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`silu_and_mul(self(x))` (`LinearMethod.apply_silu_and_mul`)."""
        return self.method.apply_silu_and_mul(self, x, silu_and_mul)


class StackedLinear(Linear):
    """Several checkpoint projections side by side (q|k|v, gate|up), run as one GEMM: rows of the weight (and bias)
    are the shards `shard_names` in order, `shard_sizes` rows each."""

    def __init__(
        self,
        in_features: int,
        shard_names: tuple[str, ...],
        shard_sizes: tuple[int, ...],
        bias: bool,
        method: LinearMethod,
    ) -> None:
        super().__init__(in_features, sum(shard_sizes), bias, method)
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
