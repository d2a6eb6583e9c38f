# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""q/k RMSNorm + neox RoPE + paged K/V store on the fused qkv projection, as one Triton kernel, and its launcher.

Each token's qkv row holds q [Hq, D], then k [Hkv, D], then v [Hkv, D]. Per token, the kernel
1. normalizes each q and k head over D (Qwen3's q_norm/k_norm; `RMSNorm` semantics) when weights are given,
2. rotates q and k neox-style: `x * cos + rotate_half(x) * sin`, with cos/sin rounded to the activation dtype
   first and each product and the sum rounded to it, as the torch version does,
3. returns q [T, Hq, D] and writes the rotated k and the untouched v into the layer's pool slice at
   `slot_mapping`, as `store_kv` does; a slot < 0 (a CUDA-graph padding token) writes nothing.
The torch version is `engine.layers.torch_ops.qk_norm_rope_store`.

The cos/sin cache is float32 [max_position, D]: row p holds cos(p * inv_freq) for the D/2 frequencies, then
sin(p * inv_freq) (`engine.layers.rotary_embedding.cos_sin_cache` builds it).
Grid (T, 2): program 0 of a token does its q heads, program 1 its k and v heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.layers.pdl import pdl_launch, pdl_supported

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _norm_rope(
    heads_ptr,
    cos,
    sin,
    weight_ptr,
    eps,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    # Both halves [BLOCK_H, D/2] of NUM_HEADS consecutive heads, normalized and rotated, as float32 values that
    # are already rounded to the activation dtype.
    dtype = heads_ptr.dtype.element_ty
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HEAD_DIM // 2)[None, :]
    mask = h < NUM_HEADS
    x1 = tl.load(heads_ptr + h * HEAD_DIM + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(heads_ptr + h * HEAD_DIM + HEAD_DIM // 2 + d, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        variance = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM
        rstd = tl.math.rsqrt(variance + eps)[:, None]
        w1 = tl.load(weight_ptr + d).to(tl.float32)
        w2 = tl.load(weight_ptr + HEAD_DIM // 2 + d).to(tl.float32)
        x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    # NOTE: rotate_half(x) = (-x2, x1); rounding each product, then the sum, keeps torch's bf16 results exactly.
    out1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
    out2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    return out1, out2


@triton.jit
def _rope_q(
    row_ptr,
    cos,
    sin,
    weight_ptr,
    eps,
    q_out_ptr,
    stride_qh,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    q1, q2 = _norm_rope(row_ptr, cos, sin, weight_ptr, eps, NUM_HEADS, BLOCK_H, HEAD_DIM, HAS_NORM)
    h = tl.arange(0, BLOCK_H)[:, None]
    dst = q_out_ptr + h * stride_qh + tl.arange(0, HEAD_DIM // 2)[None, :]
    tl.store(dst, q1.to(q_out_ptr.dtype.element_ty), mask=h < NUM_HEADS)
    tl.store(dst + HEAD_DIM // 2, q2.to(q_out_ptr.dtype.element_ty), mask=h < NUM_HEADS)


@triton.jit
def _to_cache(x, scale, src_ptr, dst_ptr, KV_FP8: tl.constexpr):
    # An fp8 cache holds (x rounded to the model dtype, src_ptr's) / scale (IEEE division, as torch's), saturated to
    # +-448, rounded to nearest even: the bf16 cache's value quantized, as torch does it (x's float32 rounded straight
    # to fp8 differs on ~1.5% of the values: where the model-dtype rounding lands on an fp8 tie). One return, for the
    # compiler's typing.
    if KV_FP8:
        model_x = x.to(src_ptr.dtype.element_ty).to(tl.float32)
        y = tl.clamp(tl.div_rn(model_x, scale), -448.0, 448.0).to(dst_ptr.dtype.element_ty)
    else:
        y = x.to(dst_ptr.dtype.element_ty)
    return y


@triton.jit
def _rope_store_kv(
    k_row_ptr,
    cos,
    sin,
    weight_ptr,
    eps,
    dst_ptr,
    stride_ckv,
    stride_ch,
    k_scale,
    v_scale,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    k1, k2 = _norm_rope(k_row_ptr, cos, sin, weight_ptr, eps, NUM_KV_HEADS, BLOCK_H, HEAD_DIM, HAS_NORM)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    mask = h < NUM_KV_HEADS
    half = tl.arange(0, HEAD_DIM // 2)[None, :]
    dst = dst_ptr + h * stride_ch + half
    tl.store(dst, _to_cache(k1, k_scale, k_row_ptr, dst_ptr, KV_FP8), mask=mask)
    tl.store(dst + HEAD_DIM // 2, _to_cache(k2, k_scale, k_row_ptr, dst_ptr, KV_FP8), mask=mask)
    value = tl.load(k_row_ptr + NUM_KV_HEADS * HEAD_DIM + h * HEAD_DIM + d, mask=mask)
    v_dst = dst_ptr + stride_ckv + h * stride_ch + d
    tl.store(v_dst, _to_cache(value, v_scale, k_row_ptr, dst_ptr, KV_FP8), mask=mask)


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cache_ptr,
    slot_mapping_ptr,
    q_out_ptr,
    eps,
    k_scale,
    v_scale,
    stride_qkv,
    stride_cos_sin,
    stride_cb,
    stride_ckv,
    stride_ct,
    stride_ch,
    stride_qt,
    stride_qh,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_NORM: tl.constexpr,
    KV_FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()  # NOTE: a PDL launch (engine.layers.pdl): qkv is the previous kernel's output
    token = tl.program_id(0).to(tl.int64)
    dtype = q_out_ptr.dtype.element_ty
    d = tl.arange(0, HEAD_DIM // 2)
    cos_sin = cos_sin_ptr + tl.load(positions_ptr + token) * stride_cos_sin
    cos = tl.load(cos_sin + d).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(cos_sin + HEAD_DIM // 2 + d).to(dtype).to(tl.float32)[None, :]
    row = qkv_ptr + token * stride_qkv
    if tl.program_id(1) == 0:
        q_out = q_out_ptr + token * stride_qt
        _rope_q(row, cos, sin, q_norm_ptr, eps, q_out, stride_qh, NUM_HEADS, BLOCK_HQ, HEAD_DIM, HAS_NORM)
    else:
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        # NOTE: a negative slot marks a padding token (e.g. a CUDA-graph batch padded past its requests).
        if slot >= 0:
            dst = cache_ptr + (slot // PAGE) * stride_cb + (slot % PAGE) * stride_ct
            _rope_store_kv(
                row + NUM_HEADS * HEAD_DIM,
                cos,
                sin,
                k_norm_ptr,
                eps,
                dst,
                stride_ckv,
                stride_ch,
                k_scale,
                v_scale,
                NUM_KV_HEADS,
                BLOCK_HKV,
                HEAD_DIM,
                HAS_NORM,
                KV_FP8,
            )


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    out: torch.Tensor | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    pdl: bool = False,
) -> torch.Tensor:
    """Normalizes (when both weights [D] are given) and rotates q and k of qkv [T, (Hq + 2 * Hkv) * D] by
    positions [T] (int64), stores k and v into kv_cache [num_blocks, 2, block_size, Hkv, D] (any strides but a
    unit one on D, e.g. one layer of the pool) at slot_mapping [T] (int64, < 0 = skip) and returns q [T, Hq, D]
    (into out when given, else a new contiguous tensor). cos_sin_cache: see the module docstring; positions must
    be rows of it (not checked, which would read the device). A float8_e4m3fn kv_cache gets k / kv_scales[0] and
    v / kv_scales[1], saturated; a cache in qkv's dtype gets k and v as they are (the scales are not read).
    `pdl`: launched early (where `pdl_supported`), waiting for the previous kernel before its first load.
    """
    num_tokens = _check_args(
        qkv,
        positions,
        cos_sin_cache,
        q_norm_weight,
        k_norm_weight,
        kv_cache,
        slot_mapping,
        num_heads,
        num_kv_heads,
        head_dim,
    )
    if out is None:
        out = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if out.shape != (num_tokens, num_heads, head_dim) or out.dtype != qkv.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out {out.dtype}{tuple(out.shape)} is not [{num_tokens}, {num_heads}, {head_dim}] with a "
            f"unit stride on head_dim, of {qkv.dtype}"
        )
    if num_tokens == 0:
        return out
    pdl = pdl and pdl_supported(qkv.device)
    block_hq = triton.next_power_of_2(num_heads)
    _qk_norm_rope_store_kernel[(num_tokens, 2)](
        qkv,
        positions,
        cos_sin_cache,
        q_norm_weight,
        k_norm_weight,
        kv_cache,
        slot_mapping,
        out,
        eps,
        kv_scales[0],
        kv_scales[1],
        qkv.stride(0),
        cos_sin_cache.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_HQ=block_hq,
        BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        PAGE=kv_cache.shape[2],
        HAS_NORM=q_norm_weight is not None,
        KV_FP8=kv_cache.dtype == torch.float8_e4m3fn,
        PDL=pdl,
        num_warps=4 if block_hq * head_dim <= 2048 else 8,
        # NOTE: no FMA contraction, or `x1 * cos - x2 * sin` skips the product's rounding that torch does.
        enable_fp_fusion=False,
        **pdl_launch(pdl),
    )
    return out


def _check_args(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> int:
    """Validates one launch and returns its token count."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two >= 16")
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1 or qkv.dtype not in DTYPES:
        raise ValueError(f"qkv {qkv.dtype}{tuple(qkv.shape)} is not [T, {width}] with unit column stride, of {DTYPES}")
    num_tokens = qkv.shape[0]
    for name, index in (("positions", positions), ("slot_mapping", slot_mapping)):
        if index.shape != (num_tokens,) or index.dtype != torch.int64 or not index.is_contiguous():
            raise ValueError(f"{name} {index.dtype}{tuple(index.shape)} is not a dense [{num_tokens}] int64")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or cos_sin_cache.dtype != torch.float32:
        raise ValueError(
            f"cos_sin_cache {cos_sin_cache.dtype}{tuple(cos_sin_cache.shape)} is not [*, {head_dim}] float32"
        )
    if cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache needs a unit stride on its columns")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight are given together or not at all")
    for weight in (q_norm_weight, k_norm_weight):
        if weight is not None and (weight.shape != (head_dim,) or weight.dtype != qkv.dtype or weight.stride(0) != 1):
            raise ValueError(f"norm weight {weight.dtype}{tuple(weight.shape)} is not a dense [{head_dim}] {qkv.dtype}")
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[3:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} is not [num_blocks, 2, block_size, {num_kv_heads}, {head_dim}]"
        )
    if kv_cache.dtype not in (qkv.dtype, torch.float8_e4m3fn) or kv_cache.stride(4) != 1:
        raise ValueError(
            f"kv_cache {kv_cache.dtype} needs qkv's dtype {qkv.dtype} (or float8_e4m3fn) and a unit stride on head_dim"
        )
    return num_tokens
