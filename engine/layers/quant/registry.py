"""`quantization` and `kv_cache_dtype` -> what the device and the checkpoint can run, checked at start-up.

`quantization="auto"` takes the checkpoint's `quantization_config.quant_method` (gptq, awq, compressed-tensors
FP8) and else runs the float weights as they are; naming a method the checkpoint contradicts, or one the device
cannot run, is an InvalidArgumentError naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from common.errors import InvalidArgumentError
from engine.config import KV_CACHE_DTYPES, QUANTIZATIONS
from engine.layers.quant.base import QuantMethod
from engine.layers.quant.fp8 import CompressedTensorsFp8, Fp8, Fp8Gemm
from engine.layers.quant.int4 import Awq, Gptq
from engine.layers.quant.int4_random import RANDOM_CHECKPOINT_CONFIGS
from engine.layers.quant.int8 import Int8
from engine.layers.quant.unquantized import Unquantized

_CHECKPOINT_FORMATS = {"gptq": Gptq, "awq": Awq}
# NOTE: llm-compressor's format; only its FP8 scheme is read (engine.layers.quant.fp8).
_COMPRESSED_TENSORS = "compressed-tensors"
_FP8_MIN_CAPABILITY = (8, 9)


def resolve_quant_method(
    requested: str, checkpoint_config: Mapping[str, Any] | None, device: torch.device, random_weights: bool = False
) -> QuantMethod:
    """The method of `requested` for a checkpoint whose config.json holds `checkpoint_config` (or none); random
    weights (load_format="dummy") of an int4 method stand for a checkpoint of RANDOM_CHECKPOINT_CONFIGS. int4 weights
    stay packed on CUDA (the int4 kernels) and are dequantized at load elsewhere."""
    stored = checkpoint_config.get("quant_method") if checkpoint_config else None
    supported = (*_CHECKPOINT_FORMATS, _COMPRESSED_TENSORS)
    if stored is not None and stored not in supported:
        raise InvalidArgumentError(
            "quantization_config.quant_method",
            f"checkpoint quantized with {stored!r}; supported: {', '.join(supported)}",
        )
    method = (stored or "none") if requested == "auto" else requested
    if stored == _COMPRESSED_TENSORS and method in ("fp8", stored):
        assert checkpoint_config is not None
        return CompressedTensorsFp8(checkpoint_config, *_fp8_gemms("quantization", device))
    if stored is not None and method != stored:
        raise InvalidArgumentError("quantization", f"{method!r} asked for, but the checkpoint is {stored}-quantized")
    if method in _CHECKPOINT_FORMATS:
        config = RANDOM_CHECKPOINT_CONFIGS[method] if random_weights and stored is None else checkpoint_config
        if config is None or config.get("quant_method") is None:
            raise InvalidArgumentError("quantization", f"{method!r} needs a checkpoint with a quantization_config")
        return _CHECKPOINT_FORMATS[method](config, packed=device.type == "cuda")
    if method == "fp8":
        return Fp8(*_fp8_gemms("quantization", device))
    if method == "int8":
        return Int8()
    if method == "none":
        return Unquantized()
    raise InvalidArgumentError("quantization", f"must be one of {QUANTIZATIONS}, got {method!r}")


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV pool's dtype: the model's for `auto`, float8_e4m3fn for `fp8` (CUDA, capability >= 8.9, a bf16/fp16
    model: the Triton attention kernels dequantize to the query's dtype); else an InvalidArgumentError naming
    `kv_cache_dtype`."""
    if kv_cache_dtype == "fp8":
        _require_fp8_device("kv_cache_dtype", device)
        if model_dtype == torch.float32:
            raise InvalidArgumentError("kv_cache_dtype", "'fp8' needs a 16-bit model dtype (dtype is float32)")
        return torch.float8_e4m3fn
    if kv_cache_dtype != "auto":
        raise InvalidArgumentError("kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return model_dtype


def _fp8_gemms(field_name: str, device: torch.device) -> tuple[Fp8Gemm, Fp8Gemm]:
    """The FP8 GEMM and its gated variant (gate_up with SwiGLU) on `device`."""
    _require_fp8_device(field_name, device)
    from engine.layers.triton_fp8_linear import fp8_linear, fp8_linear_silu_and_mul

    return fp8_linear, fp8_linear_silu_and_mul


def _require_fp8_device(field_name: str, device: torch.device) -> None:
    capable = device.type == "cuda" and torch.cuda.get_device_capability(device) >= _FP8_MIN_CAPABILITY
    if not capable:
        raise InvalidArgumentError(
            field_name, f"'fp8' needs a CUDA device with compute capability >= 8.9 (this device: {_describe(device)})"
        )


def _describe(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}"
