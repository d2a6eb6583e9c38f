"""int8 weight-only: a float checkpoint quantized at load, symmetric, one scale per output channel.

`weight_int8[o, i] = round(weight[o, i] / scale[o])` with `scale[o] = max_i |weight[o, i]| / 127`, so the error of
each weight is at most scale[o] / 2. The layer keeps the int8 weight and runs `(x @ weight_int8^T) * scale + bias`
in the activation dtype (torch on CPU and GPU alike; a fused GPU kernel can replace `apply` later).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.linear import Linear, LinearMethod
from engine.layers.quant.base import QuantMethod

INT8_MAX = 127


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 weight [out, in], float32 scale [out]); an all-zero row gets scale 1."""
    w = weight.float()
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


class Int8LinearMethod(LinearMethod):
    def process_weights_after_loading(self, layer: Linear) -> None:
        dtype = layer.weight.dtype
        q, scale = quantize_int8(layer.weight.data)
        layer.weight = torch.nn.Parameter(q, requires_grad=False)
        layer.register_parameter("weight_scale", torch.nn.Parameter(scale.to(dtype), requires_grad=False))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, layer.weight.to(x.dtype)) * layer.get_parameter("weight_scale")
        return out if layer.bias is None else out + layer.bias


class Int8(QuantMethod):
    name = "int8"

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return Int8LinearMethod()

    def head_method(self, unquantized: LinearMethod) -> LinearMethod:
        return self.linear_method(unquantized)
