"""Physical limits measured on the machine at hand, for figures reported as a ratio of the limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


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
