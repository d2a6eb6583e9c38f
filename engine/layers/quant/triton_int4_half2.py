# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""The packed half-precision (HALF2) steps of the int4 GEMV (`engine.layers.quant.triton_int4`), and its x loads.

Per packed word (8 nibbles, channels 16t + w of its group for t = 0..7): four pairs, nibbles j and j + 4 for
j = 0..3. `(word >> 4j & 0x000F000F) | magic` is the pair (m + q_j, m + q_j+4) in x's dtype (bf16 m = 128, fp16
m = 1024: OR-ing a nibble into the low mantissa bits adds it); one packed FMA by 1 with -(m + zero) leaves
q - zero exactly (integers below 2^8); one packed FMA adds its product with x's pair (channels 16j + w and
16j + w + 64) to the word's packed sum; the sum's two halves are widened to float32 and added once per word. On
the GPU these are inline assembly (`ASM`); Triton's interpreter runs none, so there plain Triton computes the same
roundings.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# NOTE: (m, m) in each dtype with m's low 8 mantissa bits clear: OR-ing a nibble in gives m + q (bf16 m = 128,
# fp16 m = 1024, where the dtype's step is 1).
HALF_MAGIC = {torch.bfloat16: 0x43004300, torch.float16: 0x64006400}
# NOTE: the packed steps of the HALF2 GEMV per dtype (`_pair_fma`, `_pair_sum`); "one" is (1.0, 1.0).
_PAIR_FMA_BF16 = tl.constexpr(
    "{ .reg .b32 one, q, d; lop3.b32 q, $1, 0x000F000F, 0x43004300, 0xEA; mov.b32 one, 0x3F803F80; "
    "fma.rn.bf16x2 d, q, one, $2; fma.rn.bf16x2 $0, d, $3, $4; }"
)
_PAIR_FMA_F16 = tl.constexpr(
    "{ .reg .b32 one, q, d; lop3.b32 q, $1, 0x000F000F, 0x64006400, 0xEA; mov.b32 one, 0x3C003C00; "
    "fma.rn.f16x2 d, q, one, $2; fma.rn.f16x2 $0, d, $3, $4; }"
)
_PAIR_ADD_BF16 = tl.constexpr("{ .reg .b32 one; mov.b32 one, 0x3F803F80; fma.rn.bf16x2 $0, $1, one, $2; }")
_PAIR_ADD_F16 = tl.constexpr("{ .reg .b32 one; mov.b32 one, 0x3C003C00; fma.rn.f16x2 $0, $1, one, $2; }")
_PAIR_SUM_BF16 = tl.constexpr(
    "{ .reg .b32 lo, hi; shl.b32 lo, $1, 16; and.b32 hi, $1, 0xFFFF0000; add.f32 $0, lo, hi; }"
)
_PAIR_SUM_F16 = tl.constexpr(
    "{ .reg .b16 l, h; .reg .f32 fl, fh; mov.b32 {l, h}, $1; cvt.f32.f16 fl, l; cvt.f32.f16 fh, h; "
    "add.f32 $0, fl, fh; }"
)


@triton.jit
def _x_at(x_row, perm_ptr, cols, ok, HAS_PERM: tl.constexpr, EVEN: tl.constexpr):
    """x's values at kernel-order channels `cols` (gathered through the act-order permutation); EVEN: every
    program's groups fill its tiles, so no load needs `ok` (a masked load also zeroes its registers first)."""
    if EVEN:
        if HAS_PERM:
            cols = tl.load(perm_ptr + cols)
        x = tl.load(x_row + cols)
    else:
        if HAS_PERM:
            cols = tl.load(perm_ptr + cols, mask=ok, other=0)
        x = tl.load(x_row + cols, mask=ok, other=0)
    return x


@triton.jit
def _half_bits(x):
    """A bf16/fp16 value's bits in the low 16 bits of an int32."""
    return x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _half_to_float(bits, dtype: tl.constexpr):
    """The bf16/fp16 value in the low 16 bits of an int32, as float32."""
    return (bits & 0xFFFF).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)


@triton.jit
def _pair_fma(shifted, neg_zeros, x_pairs, acc, MAGIC: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr):
    """acc + (pairs + neg_zeros) * x_pairs on pairs of `dtype` values packed in int32s, where pairs =
    (shifted & 0x000F000F) | MAGIC = (m + q, m + q'): one LOP3 and two packed FMAs, the first exact (neg_zeros =
    -(m + zero), integers below 2^8), the second rounding once. The magic and mask sit in the assembly: as Triton
    constants ptxas re-materialized the mask before every LOP3 (an IMAD.MOV per pair)."""
    if ASM:
        asm: tl.constexpr = _PAIR_FMA_BF16 if dtype == tl.bfloat16 else _PAIR_FMA_F16
        out = tl.inline_asm_elementwise(
            asm, "=r,r,r,r,r", [shifted, neg_zeros, x_pairs, acc], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        pairs = (shifted & 0x000F000F) | MAGIC
        lo = (_half_to_float(pairs, dtype) + _half_to_float(neg_zeros, dtype)) * _half_to_float(x_pairs, dtype)
        hi = (_half_to_float(pairs >> 16, dtype) + _half_to_float(neg_zeros >> 16, dtype)) * _half_to_float(
            x_pairs >> 16, dtype
        )
        lo = _rounded_bits(lo + _half_to_float(acc, dtype), dtype)
        out = lo | (_rounded_bits(hi + _half_to_float(acc >> 16, dtype), dtype) << 16)
    return out


@triton.jit
def _rounded_bits(v, dtype: tl.constexpr):
    """float32 v rounded to nearest even in `dtype`, its bits in the low 16 bits of an int32 (the interpreter's
    float32 -> bfloat16 cast truncates, so bf16 rounds on the bits here; finite values only)."""
    if dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    else:
        out = _half_bits(v.to(dtype))
    return out


@triton.jit
def _half2_word_sums(
    words,
    zero,
    x_row,
    perm_ptr,
    g0,
    g3,
    w3,
    group_ok,
    HAS_PERM: tl.constexpr,
    EVEN: tl.constexpr,
    MAGIC: tl.constexpr,
    ASM: tl.constexpr,
):
    """The sum of (q - zero) * x over the 16 nibbles of each two adjacent words [BLOCK_N, GROUPS, 8]: per word 4
    packed pairs (nibbles j and j + 4 = channels 16j + w and 16j + w + 64) summed in x's dtype by `_pair_fma`, the
    two words' packed sums added (`_pair_add`), then widened to float32 (`_pair_sum`)."""
    dtype: tl.constexpr = x_row.dtype.element_ty
    neg_zero = zero.to(tl.int32) | (MAGIC & 0xFFFF) | 0x8000  # -(m + zero) in x's dtype: m + zero = m | zero
    neg_zeros = neg_zero | (neg_zero << 16)
    acc = tl.zeros(words.shape, dtype=tl.int32)  # packed (+0, +0)
    for j in tl.static_range(4):
        cols = (g0 + g3) * 128 + j * 16 + w3
        x_lo = _x_at(x_row, perm_ptr, cols, group_ok, HAS_PERM, EVEN)
        x_pairs = _pack_pair(x_lo, _x_at(x_row, perm_ptr, cols + 64, group_ok, HAS_PERM, EVEN), ASM)
        acc = _pair_fma(words >> (4 * j), neg_zeros, x_pairs, acc, MAGIC, dtype, ASM)
    # NOTE: adjacent words sit in one thread (16-byte loads), so the split moves no data between threads.
    even, odd = tl.split(tl.reshape(acc, (acc.shape[0], acc.shape[1], acc.shape[2] // 2, 2)))
    return _pair_sum(_pair_add(even, odd, dtype, ASM), dtype, ASM)


@triton.jit
def _pair_add(a, b, dtype: tl.constexpr, ASM: tl.constexpr):
    """a + b on pairs of `dtype` values packed in int32s, rounded once (a packed FMA by 1)."""
    if ASM:
        asm: tl.constexpr = _PAIR_ADD_BF16 if dtype == tl.bfloat16 else _PAIR_ADD_F16
        out = tl.inline_asm_elementwise(asm, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        lo = _rounded_bits(_half_to_float(a, dtype) + _half_to_float(b, dtype), dtype)
        out = lo | (_rounded_bits(_half_to_float(a >> 16, dtype) + _half_to_float(b >> 16, dtype), dtype) << 16)
    return out


@triton.jit
def _pack_pair(lo, hi, ASM: tl.constexpr):
    """Two bf16/fp16 tensors as one int32 tensor of pairs (lo in the low half): one PRMT each on the GPU."""
    if ASM:
        out = tl.inline_asm_elementwise(
            "mov.b32 $0, {$1, $2};", "=r,h,h", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        out = _half_bits(lo) | (_half_bits(hi) << 16)
    return out


@triton.jit
def _pair_sum(pairs, dtype: tl.constexpr, ASM: tl.constexpr):
    """The sum of each packed pair's two values, in float32 (bf16: a shift and a mask make the two floats)."""
    if ASM:
        asm: tl.constexpr = _PAIR_SUM_BF16 if dtype == tl.bfloat16 else _PAIR_SUM_F16
        out = tl.inline_asm_elementwise(asm, "=f,r", [pairs], dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = _half_to_float(pairs, dtype) + _half_to_float(pairs >> 16, dtype)
    return out
