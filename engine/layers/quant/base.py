"""The seam every weight format plugs into.

A `QuantMethod` is chosen once per model load. It does two things:
1. `translate` turns the checkpoint's tensors into the tensors the model's parameters take (int4 checkpoints
   dequantize here; float checkpoints pass through);
2. `linear_method` gives the `LinearMethod` of the decoder's projections: it creates a layer's parameters,
   finishes them once every weight is loaded (`process_weights_after_loading`, e.g. float -> int8 + scales) and
   runs the layer (`apply`).
The embedding and `lm_head` always use the unquantized method: the model code names no format.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.layers.linear import Linear

NamedTensors = Iterator[tuple[str, torch.Tensor]]


class LinearMethod(ABC):
    """How a `Linear` stores and runs its weight."""

    def create_weights(self, layer: Linear) -> None:
        """Register the parameters a checkpoint loads into; default: a float `weight` [out, in] in the default dtype,
        initialized as nn.Linear does (random-weight models run on it)."""
        weight = torch.empty(layer.out_features, layer.in_features)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)

    def process_weights_after_loading(self, layer: Linear) -> None:  # noqa: B027 (optional hook)
        """Turn the loaded parameters into the ones `apply` reads (default: nothing to do)."""

    @abstractmethod
    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out], bias included."""


class QuantMethod(ABC):
    """One weight format: what it reads from a checkpoint and how the decoder's projections run."""

    name: str

    @abstractmethod
    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        """The method of the decoder's projections (`unquantized` is the device's float method)."""

    def translate(self, tensors: NamedTensors) -> NamedTensors:
        """The checkpoint's (name, tensor) pairs as the model's parameters take them (default: as they are)."""
        return tensors
