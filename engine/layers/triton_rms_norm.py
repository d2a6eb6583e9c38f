# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""RMSNorm and residual add + RMSNorm as one Triton kernel each, and their launchers.

Semantics are those of the torch versions in `engine.layers.torch_ops` (Hugging Face's): the statistics in
float32, `x * rsqrt(mean(x^2) + eps)` rounded to the input dtype, THEN multiplied by the weight in that dtype.
The residual add rounds to the input dtype first, as `x = x + attn_out` does. One program per row; the whole
row sits in registers, so every element is read before any is written (outputs may alias inputs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.pdl import pdl_launch, pdl_supported

MAX_HIDDEN_SIZE = 16384
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL_TRIGGER: tl.constexpr,
    PDL_WAIT: tl.constexpr,
):
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()  # NOTE: a PDL launch (engine.layers.pdl): x is the previous kernel's output
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()  # NOTE: engine.layers.pdl: the next GEMV may start loading weights
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + residual).to(dtype).to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden_size
    normed = (x * tl.math.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # NOTE: both stores come after the reduction, which every load feeds, so in-place outputs are safe.
    if HAS_RESIDUAL:
        tl.store(residual_out_ptr + row * stride_ro + cols, x.to(dtype), mask=mask)
    tl.store(out_ptr + row * stride_o + cols, (normed * weight).to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None, pdl: bool = False
) -> torch.Tensor:
    """RMSNorm of each row of x [T, hidden] (rows may be strided) with weight [hidden] of x's dtype.

    Returns out [T, hidden], allocated when not given; it may be x itself. `pdl`: launched early (where
    `pdl_supported`), waiting for the previous kernel before its first load.
    """
    out = _output("out", out, x)
    _launch(x, None, weight, out, None, eps, pdl)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_out = x + residual (rounded to the dtype), out = RMSNorm(residual_out); all [T, hidden].

    Outputs are allocated when not given. `fused_add_rms_norm(x, r, w, eps, out=x, residual_out=r)` runs in
    place (no allocation): an output may be one of the inputs, never a partly overlapping view of one. `pdl`: as
    `rms_norm`'s.
    """
    _output("residual", residual, x)
    out = _output("out", out, x)
    residual_out = _output("residual_out", residual_out, x)
    _launch(x, residual, weight, out, residual_out, eps, pdl)
    return out, residual_out


def _output(name: str, t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """t checked against x's shape and dtype, or a new tensor like x when t is None."""
    if t is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if t.shape != x.shape or t.dtype != x.dtype:
        raise ValueError(f"{name} {t.dtype}{tuple(t.shape)} differs from x {x.dtype}{tuple(x.shape)}")
    return t


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
    eps: float,
    pdl: bool,
) -> None:
    if x.dim() != 2 or not 0 < x.shape[1] <= MAX_HIDDEN_SIZE:
        raise ValueError(f"x {tuple(x.shape)} is not [T, hidden] with 0 < hidden <= {MAX_HIDDEN_SIZE}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not one of {DTYPES}")
    num_tokens, hidden_size = x.shape
    if weight.shape != (hidden_size,) or weight.dtype != x.dtype or weight.stride(0) != 1:
        raise ValueError(f"weight {weight.dtype}{tuple(weight.shape)} is not a dense [{hidden_size}] {x.dtype}")
    rows = [x, out] + [t for t in (residual, residual_out) if t is not None]
    if any(t.stride(1) != 1 for t in rows):
        raise ValueError("x, residual and the outputs need a unit stride on the hidden dim")
    if num_tokens == 0:
        return
    pdl = pdl and pdl_supported(x.device)
    block = triton.next_power_of_2(hidden_size)
    _rms_norm_kernel[(num_tokens,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        residual_out.stride(0) if residual_out is not None else 0,
        hidden_size,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        PDL_TRIGGER=pdl_supported(x.device),
        PDL_WAIT=pdl,
        num_warps=_num_warps(block),
        **pdl_launch(pdl),
    )


def _num_warps(block: int) -> int:
    """Eight contiguous elements (16 bytes of bf16) per thread up to 16 warps."""
    return max(1, min(16, block // 256))
