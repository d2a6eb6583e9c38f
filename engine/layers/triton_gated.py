# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The batch-1 GEMVs' gated variant: the gate_up projection and SwiGLU's `silu(gate) * up` in one launch.

A batch-1 decode step ran the gate_up GEMV, then `silu_and_mul` on its [1, 2 * I] output: one more launch per layer
(~1.7 us of a 2 us kernel plus its launch gap, 36 times a step on the 8B shape) for 2 * I values. A GEMV program
owns BLOCK_N weight rows; gated, those are BLOCK_N // 2 gate rows and the up rows `half_n` (= I) below them,
interleaved (gate, up, gate, up ...) so that the row sums split into the two halves at the end (`tile_rows`), and
the program writes BLOCK_N // 2 products (`store_rows`). No weight moves: the checkpoint's [gate | up] layout stays,
as the prefill GEMMs read it. The rounding is the two kernels': the row sums rounded to the output dtype, silu in
float32 rounded again, the product rounded once more (engine.layers.triton_activation), so the result is that of
the GEMV then `silu_and_mul`, bit for bit.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_rows(BLOCK_N: tl.constexpr, half_n, GATED: tl.constexpr):
    """This program's weight rows: BLOCK_N consecutive ones, or (GATED) BLOCK_N // 2 gate rows and their up rows
    `half_n` further, interleaved."""
    r = tl.arange(0, BLOCK_N)
    if GATED:  # noqa: SIM108 (a statement: the compiler then types the taken branch only)
        rows = tl.program_id(0) * (BLOCK_N // 2) + r // 2 + (r % 2) * half_n
    else:
        rows = tl.program_id(0) * BLOCK_N + r
    return rows


@triton.jit
def store_rows(out_ptr, rows, out, BLOCK_N: tl.constexpr, GATED: tl.constexpr):
    """The row sums `out` (float32, bias and scales applied) at `rows` of out_ptr, or (GATED) silu(gate) * up of each
    (gate, up) pair at this program's BLOCK_N // 2 outputs."""
    dtype = out_ptr.dtype.element_ty
    if GATED:
        gate, up = tl.split(tl.reshape(out.to(dtype).to(tl.float32), (BLOCK_N // 2, 2)))
        # NOTE: div_rn, as triton_activation's kernel (`/` on float32 compiles to an approximate division).
        silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dtype).to(tl.float32)
        outputs = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + outputs, (silu * up).to(dtype))
    else:
        tl.store(out_ptr + rows, out.to(dtype))
