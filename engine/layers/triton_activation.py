# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""SwiGLU's `silu(gate) * up` on the fused gate_up projection as one Triton kernel, and its launcher.

Rounding follows `F.silu(gate) * up` in the input dtype, as the torch version `engine.layers.torch_ops.silu_and_mul`:
silu computed in float32 and rounded to the dtype, then the product rounded again. The exp is Triton's fast
exp2-based one (a few float32 ulps), so a rare bf16 result lands one rounding step away from torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.pdl import pdl_supported

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr, out_ptr, stride_in, stride_out, intermediate_size, BLOCK: tl.constexpr, PDL_TRIGGER: tl.constexpr
):
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()  # NOTE: engine.layers.pdl: the next GEMV may start loading weights
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate_size
    dtype = out_ptr.dtype.element_ty
    row = gate_up_ptr + token * stride_in
    gate = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + intermediate_size + cols, mask=mask, other=0.0).to(tl.float32)
    # NOTE: div_rn, since `/` on float32 compiles to an approximate division.
    silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dtype).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, (silu * up).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [T, 2 * I] (gate columns first, then up; rows may be strided) -> silu(gate) * up [T, I].

    out is allocated when not given.
    """
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.dtype not in DTYPES:
        raise ValueError(f"gate_up {gate_up.dtype}{tuple(gate_up.shape)} is not [T, 2 * I] of one of {DTYPES}")
    num_tokens, intermediate_size = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty(num_tokens, intermediate_size, dtype=gate_up.dtype, device=gate_up.device)
    if out.shape != (num_tokens, intermediate_size) or out.dtype != gate_up.dtype:
        raise ValueError(
            f"out {out.dtype}{tuple(out.shape)} is not [{num_tokens}, {intermediate_size}] {gate_up.dtype}"
        )
    if gate_up.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("gate_up and out need a unit stride on their columns")
    if num_tokens == 0 or intermediate_size == 0:
        return out
    block = min(MAX_BLOCK, triton.next_power_of_2(intermediate_size))
    grid = (num_tokens, triton.cdiv(intermediate_size, block))
    _silu_and_mul_kernel[grid](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        intermediate_size,
        BLOCK=block,
        PDL_TRIGGER=pdl_supported(gate_up.device),
        num_warps=max(1, block // 256),
    )
    return out
