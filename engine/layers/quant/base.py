"""The seam every weight format plugs into.

A `QuantMethod` is chosen once per model load. It does two things:
1. `translate` turns the checkpoint's tensors into the tensors the model's parameters take (int4 checkpoints
   dequantize here; float checkpoints pass through);
2. `linear_method` gives the `LinearMethod` (engine.layers.linear) of the decoder's projections: it creates a
   layer's parameters, finishes them once every weight is loaded (`process_weights_after_loading`, e.g.
   float -> int8 + scales) and runs the layer (`apply`).
The embedding stays in the model dtype; so does the `lm_head` unless `quantize_lm_head` asks for `head_method`.
The model code names no format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping

import torch

from common.errors import InvalidArgumentError
from engine.layers.linear import LinearMethod

NamedTensors = Iterator[tuple[str, torch.Tensor]]


class QuantMethod(ABC):
    """One weight format: what it reads from a checkpoint and how the decoder's projections run."""

    name: str

    @abstractmethod
    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        """The method of the decoder's projections (`unquantized` is the device's float method)."""

    def head_method(self, unquantized: LinearMethod) -> LinearMethod:
        """The lm_head's method when `quantize_lm_head` asks for it (the head is float in every checkpoint read
        here, so only a method that quantizes at load has one); default: refused, naming the field."""
        raise InvalidArgumentError(
            "quantize_lm_head", f"quantization {self.name!r} does not quantize the lm_head (fp8 and int8 do)"
        )

    def translate(self, tensors: NamedTensors) -> NamedTensors:
        """The checkpoint's (name, tensor) pairs as the model's parameters take them (default: as they are)."""
        return tensors

    def random_checkpoint(self, shapes: Mapping[str, tuple[int, int]], device: torch.device) -> NamedTensors:
        """Checkpoint tensors of random weights for the projections `shapes` names ((out, in) by prefix), for
        load_format="dummy" (default: none; the model's own random initialization stands)."""
        return iter(())
