"""FP8 (E4M3) weights with per-output-channel scales and dynamic per-token activation scales.

Two ways in, one layer format (`weight` float8_e4m3fn [out, in] beside a float32 `weight_scale` [out]):
- `Fp8`: a bf16/fp16 checkpoint quantized at load, `scale[o] = max_i |w[o, i]| / 448`, `w_fp8 = round(w / scale)`;
- `CompressedTensorsFp8`: an llm-compressor checkpoint (`quant_method: compressed-tensors`, format
  `float-quantized`) loads as it is: `*.weight` in float8_e4m3fn and `*.weight_scale` per channel ([out, 1]) or per
  tensor (one value, spread over the rows here so that q/k/v stacked into one GEMM keep their own scales); a
  decoder projection it left in float (named in its `ignore` list) is quantized at load as `Fp8` does.
A layer runs `y = (x_fp8 @ w_fp8^T) * x_scale[t] * weight_scale[o] + bias`, x quantized per token at run time
(`engine.layers.triton_fp8_linear` on CUDA: a one-row GEMV at batch 1, `torch._scaled_mm` above;
`fp8_linear_reference` is the same function in torch, the oracle of the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from common.errors import InvalidArgumentError
from engine.layers.linear import Linear, LinearMethod
from engine.layers.quant.base import NamedTensors, QuantMethod

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
# NOTE: a floor on activation scales, so an all-zero row divides by a positive number.
MIN_SCALE = 1e-12

Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(x [T, in], weight fp8 [out, in], weight_scale float32 [out], bias | None) -> y [T, out] in x's dtype."""


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (float8_e4m3fn [R, C], float32 scale [R]) with `x[r] ~ q[r] * scale[r]`, scale = absmax / 448."""
    xf = x.float()
    scale = (xf.abs().amax(dim=1) / FP8_MAX).clamp_(min=MIN_SCALE)
    q = (xf / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The layer's function in torch (any device): x quantized per token, products summed in float32."""
    xq, x_scale = quantize_fp8_rows(x)
    out = (xq.float() @ weight.float().T) * x_scale[:, None] * weight_scale.float()[None, :]
    out = out.to(x.dtype)
    return out if bias is None else out + bias


class Fp8LinearMethod(LinearMethod):
    """Keeps fp8 weights + per-channel scales and runs `gemm` on them.

    `from_checkpoint`: the layer's parameters are created fp8 (the checkpoint fills them); otherwise they are
    created in the model dtype and quantized once loaded. `gemm_silu_and_mul` (optional): the gate_up projection
    and SwiGLU in one (`apply_silu_and_mul`)."""

    def __init__(self, gemm: Fp8Gemm, from_checkpoint: bool, gemm_silu_and_mul: Fp8Gemm | None = None) -> None:
        self.gemm = gemm
        self.from_checkpoint = from_checkpoint
        self.gemm_silu_and_mul = gemm_silu_and_mul

    def create_weights(self, layer: Linear) -> None:
        if not self.from_checkpoint:
            super().create_weights(layer)
            return
        weight = torch.zeros(layer.out_features, layer.in_features, dtype=FP8_DTYPE)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        scale = torch.ones(layer.out_features, dtype=torch.float32)
        layer.register_parameter("weight_scale", torch.nn.Parameter(scale, requires_grad=False))

    def process_weights_after_loading(self, layer: Linear) -> None:
        if self.from_checkpoint:
            return
        q, scale = quantize_fp8_rows(layer.weight.data)
        layer.weight = torch.nn.Parameter(q, requires_grad=False)
        layer.register_parameter("weight_scale", torch.nn.Parameter(scale, requires_grad=False))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, layer.weight, layer.get_parameter("weight_scale"), layer.bias)

    def apply_silu_and_mul(
        self, layer: Linear, x: torch.Tensor, silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.gemm_silu_and_mul is None:
            return super().apply_silu_and_mul(layer, x, silu_and_mul)
        return self.gemm_silu_and_mul(x, layer.weight, layer.get_parameter("weight_scale"), layer.bias)


class Fp8(QuantMethod):
    """A float checkpoint quantized to FP8 at load."""

    name = "fp8"

    def __init__(self, gemm: Fp8Gemm, gemm_silu_and_mul: Fp8Gemm | None = None) -> None:
        self.gemm = gemm
        self.gemm_silu_and_mul = gemm_silu_and_mul

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return Fp8LinearMethod(self.gemm, from_checkpoint=False, gemm_silu_and_mul=self.gemm_silu_and_mul)

    def head_method(self, unquantized: LinearMethod) -> LinearMethod:
        return self.linear_method(unquantized)


class CompressedTensorsFp8(QuantMethod):
    """An llm-compressor FP8 checkpoint: fp8 weights with channel or tensor scales, dynamic per-token inputs."""

    name = "compressed-tensors"

    def __init__(self, config: Mapping[str, Any], gemm: Fp8Gemm, gemm_silu_and_mul: Fp8Gemm | None = None) -> None:
        _check_compressed_tensors(config)
        self.gemm = gemm
        self.gemm_silu_and_mul = gemm_silu_and_mul

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return Fp8LinearMethod(self.gemm, from_checkpoint=True, gemm_silu_and_mul=self.gemm_silu_and_mul)

    def head_method(self, unquantized: LinearMethod) -> LinearMethod:
        # NOTE: llm-compressor leaves the lm_head in float (its default `ignore`); it is quantized at load here.
        return Fp8LinearMethod(self.gemm, from_checkpoint=False)

    def translate(self, tensors: NamedTensors) -> NamedTensors:
        weights: dict[str, torch.Tensor] = {}
        scales: dict[str, torch.Tensor] = {}
        for name, tensor in tensors:
            if name.endswith(".weight") and tensor.dtype == FP8_DTYPE:
                weights[name.removesuffix(".weight")] = tensor
            elif _is_float_projection(name, tensor):
                q, scale = quantize_fp8_rows(tensor)
                yield name, q
                yield f"{name.removesuffix('weight')}weight_scale", scale
            elif name.endswith(".weight_scale"):
                scales[name.removesuffix(".weight_scale")] = tensor
            else:
                yield name, tensor
        for prefix, weight in weights.items():
            if prefix not in scales:
                raise KeyError(f"compressed-tensors checkpoint: {prefix}.weight lacks its weight_scale")
            scale = scales.pop(prefix).float().reshape(-1)
            if scale.numel() not in (1, weight.shape[0]):
                raise ValueError(f"{prefix}.weight_scale has {scale.numel()} values for {weight.shape[0]} rows")
            yield f"{prefix}.weight", weight
            yield f"{prefix}.weight_scale", scale.expand(weight.shape[0])
        if scales:
            raise KeyError(f"compressed-tensors checkpoint: weight_scale without an fp8 weight: {sorted(scales)[:3]}")


def _is_float_projection(name: str, tensor: torch.Tensor) -> bool:
    """A decoder projection the checkpoint kept in float (its `ignore` list): quantized here as `Fp8` would."""
    return ".layers." in name and name.endswith(".weight") and tensor.dim() == 2 and tensor.is_floating_point()


def _check_compressed_tensors(config: Mapping[str, Any]) -> None:
    """Refuse every compressed-tensors scheme but FP8 weights (channel/tensor) with dynamic per-token inputs."""
    fmt = config.get("format")
    if fmt != "float-quantized":
        raise InvalidArgumentError(
            "quantization_config.format", f"{fmt!r} is not supported (supported: 'float-quantized')"
        )
    for group_name, group in (config.get("config_groups") or {}).items():
        where = f"quantization_config.config_groups.{group_name}"
        weights, inputs = group.get("weights") or {}, group.get("input_activations")
        if (weights.get("type"), weights.get("num_bits"), weights.get("strategy")) not in (
            ("float", 8, "channel"),
            ("float", 8, "tensor"),
        ):
            raise InvalidArgumentError(f"{where}.weights", f"{weights} is not FP8 with channel or tensor scales")
        if inputs is not None and (inputs.get("dynamic") is not True or inputs.get("strategy") != "token"):
            raise InvalidArgumentError(f"{where}.input_activations", f"{inputs} is not dynamic per-token")
    if config.get("kv_cache_scheme") is not None:
        raise InvalidArgumentError("quantization_config.kv_cache_scheme", "checkpoint KV scales are not supported")


def dequantize_fp8(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp8 weight [out, in] and its scales [out] -> float32 weight."""
    return weight.float() * weight_scale.float()[:, None]
