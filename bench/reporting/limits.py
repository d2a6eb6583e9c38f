"""Physical limits measured on the machine at hand, for figures reported as a ratio of the limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.models.llama import LlamaForCausalLM


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    device_name: str
    copy_bandwidth_gb_s: float  # device-to-device copy, read + write bytes counted
    matmul_tflops: float  # dense matmul of the model dtype, 8192^3


def _time_cuda(fn: Callable[[], object], iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def measure_limits(dtype: torch.dtype) -> DeviceLimits:
    """Copy bandwidth and matmul peak, measured now (CUDA only)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = _time_cuda(lambda: dst.copy_(src), 20)
    a = torch.randn(8192, 8192, dtype=dtype, device="cuda")
    b = torch.randn(8192, 8192, dtype=dtype, device="cuda")
    mm_s = _time_cuda(lambda: a @ b, 10)
    return DeviceLimits(torch.cuda.get_device_name(), 2 * (1 << 30) / copy_s / 1e9, 2 * 8192**3 / mm_s / 1e12)


def decode_bytes_per_step(model: LlamaForCausalLM, kv_bytes_per_token: int, context_len: int) -> int:
    """Bytes one batch-1 decode step must read: every weight but the embedding table (one row), plus KV. (A tied
    lm_head reads the table; one that `quantize_lm_head` quantized is a weight of its own.)"""
    assert model.lm_head is not None and model.model.embed_tokens is not None
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    weights = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if tied or not name.endswith("embed_tokens.weight")
    )
    return weights + kv_bytes_per_token * context_len


def prefill_flops(num_params_no_embed: int, num_layers: int, num_heads: int, head_dim: int, tokens: int) -> float:
    """Dense matmul FLOPs of a causal prefill: 2 * params * tokens + causal attention (QK^T and PV)."""
    return 2.0 * num_params_no_embed * tokens + 2.0 * num_layers * num_heads * head_dim * tokens * tokens
