"""What the int4 kernels (engine.layers.quant.triton_int4) must satisfy, on any device: `x @ W^T + bias` where W is
the reference quantizer's dequantized weight (tests/engine/int4_reference.py), for GPTQ, GPTQ act-order and AWQ,
through the loader's repacking. `run_interpreted_checks` runs small CPU cases in Triton's interpreter; the GPU tests
run the real shapes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from engine.layers.quant.int4 import Awq, Gptq, Int4Checkpoint
from engine.layers.quant.int4_layout import PackedInt4
from engine.layers.quant.triton_int4 import GEMV_CONFIGS, int4_linear
from tests.engine.int4_reference import Int4Format, quantization_config, quantize_projection

FORMATS = {
    "gptq": Int4Format("gptq"),
    "gptq-act-order": Int4Format("gptq", act_order=True),
    "gptq_v2-asym-act-order": Int4Format("gptq", act_order=True, symmetric=False, checkpoint_format="gptq_v2"),
    "awq": Int4Format("awq", symmetric=False),
}
FLOAT32_TOLERANCE = 1e-5
"""Relative error (norm) of float32 outputs: only the summation order differs from the float64 reference."""
HALF_TOLERANCE = 1e-2
"""Relative error of bf16/fp16 outputs vs float64: activations and output rounded to 8 (bf16) bits."""


def make_case(name: str, n: int, k: int, device: str, seed: int) -> tuple[PackedInt4, torch.Tensor]:
    """(the repacked int4 weight [n, k] on `device`, the reference's dequantized float32 weight)."""
    fmt = FORMATS[name]
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    parts, dequantized = quantize_projection(weight, fmt, np.random.default_rng(seed))
    method: Int4Checkpoint = (Gptq if fmt.method == "gptq" else Awq)(quantization_config(fmt), packed=True)
    packed = method.repack(parts)
    moved = {f: getattr(packed, f).to(device) for f in ("weight", "scale", "zero")}
    perm = None if packed.perm is None else packed.perm.to(device)
    return replace(packed, **moved, perm=perm), dequantized.to(device)


def check_int4_linear(
    case: tuple[PackedInt4, torch.Tensor], m: int, dtype: torch.dtype, bias: bool, seed: int,
    gemv_config: dict[str, int] | None = None,
) -> None:  # fmt: skip
    packed, weight = case
    gen = torch.Generator(weight.device).manual_seed(seed)
    n, k = weight.shape
    # NOTE: rows of a wider buffer: the kernels must honour x's row stride.
    x = torch.randn(m, k + 8, generator=gen, device=weight.device).to(dtype)[:, :k]
    b = torch.randn(n, generator=gen, device=weight.device).to(dtype) if bias else None
    out = int4_linear(x, packed, b, gemv_config)
    want = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert out.shape == (m, n) and out.dtype == dtype and bool(torch.isfinite(out).all())
    error = float((out.double() - want).norm() / want.norm())
    tolerance = FLOAT32_TOLERANCE if dtype == torch.float32 else HALF_TOLERANCE
    assert error < tolerance, f"m={m} n={n} k={k} {dtype} {gemv_config}: relative error {error:.2e}"


def run_interpreted_checks() -> None:
    """Small CPU cases (the process must start with TRITON_INTERPRET=1): every GEMV tile at 1 and 3 rows, the GEMM
    at 20 rows, on 48 outputs (no tile divides it) x 384 inputs (3 groups, which no multi-group tile divides)."""
    for seed, name in enumerate(FORMATS):
        case = make_case(name, 48, 384, "cpu", seed)
        for config in GEMV_CONFIGS:
            gemv = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
            check_int4_linear(case, 1, torch.float32, bias=False, seed=seed, gemv_config=gemv)
        check_int4_linear(case, 3, torch.float32, bias=True, seed=seed, gemv_config=gemv)
        check_int4_linear(case, 20, torch.float32, bias=seed % 2 == 0, seed=seed)
