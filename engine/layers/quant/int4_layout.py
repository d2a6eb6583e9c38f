"""The one int4 layout the CUDA kernels read (engine.layers.quant.triton_int4), for GPTQ and AWQ alike.

A layer's input channels are taken in kernel order: channel c of the kernel reads activation column `perm[c]`
(act-order GPTQ: the input channels sorted by group; otherwise no perm, the identity). In that order channel c
belongs to group c // 128, and for each output row n:
- `weight` int32 [N, K/8]: group g's 128 nibbles fill words g*16 .. g*16+15; nibble t (bits 4t..4t+3) of word
  g*16 + w holds channel g*128 + t*16 + w, so one nibble position of a group's 16 words is 16 consecutive channels;
- `scale` float16 [N, K/128] and `zero` uint8 [N, K/128]: `w[n, c] = (q[n, c] - zero[n, c // 128]) * scale[...]`.
Every tensor but `perm` has the output rows first, so the projections of a fused layer (q|k|v) stack by rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP_SIZE = 128
WORDS_PER_GROUP = GROUP_SIZE // 8
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclass(frozen=True, slots=True)
class PackedInt4:
    weight: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    perm: torch.Tensor | None


def pack_kernel_order(q: torch.Tensor) -> torch.Tensor:
    """Nibbles q [N, K] (int, 0..15, channels in kernel order) -> the packed words [N, K/8] int32."""
    n, k = q.shape
    nibbles = q.to(torch.int32).reshape(n, k // GROUP_SIZE, 8, WORDS_PER_GROUP)  # [n, group, t, w]
    words = (nibbles << _SHIFTS.to(q.device)[None, None, :, None]).sum(dim=2, dtype=torch.int64)
    # NOTE: the sum of disjoint bit fields is the OR; int64 holds it, the low 32 bits are the int32 word.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).reshape(n, k // 8)


def unpack_kernel_order(weight: torch.Tensor) -> torch.Tensor:
    """The packed words [N, K/8] -> nibbles [N, K] int32 in kernel order (the inverse of `pack_kernel_order`)."""
    n, words = weight.shape
    grouped = weight.reshape(n, words // WORDS_PER_GROUP, 1, WORDS_PER_GROUP)
    nibbles = (grouped >> _SHIFTS.to(weight.device)[None, None, :, None]) & 0xF
    return nibbles.reshape(n, words * 8)


def dequantize(packed: PackedInt4) -> torch.Tensor:
    """The float32 weight [N, K] the packed tensors stand for, columns in the checkpoint's channel order."""
    q = unpack_kernel_order(packed.weight)
    groups = torch.arange(q.shape[1], device=q.device) // GROUP_SIZE
    w = (q - packed.zero.to(torch.int32)[:, groups]).float() * packed.scale.float()[:, groups]
    if packed.perm is None:
        return w
    out = torch.empty_like(w)
    out[:, packed.perm.long()] = w
    return out


def act_order_perm(g_idx: torch.Tensor) -> torch.Tensor | None:
    """The kernel order of a GPTQ layer's input channels (channels sorted by group), None when already in order.

    Raises ValueError unless every group holds exactly GROUP_SIZE channels (GPTQ's act-order always does)."""
    groups = g_idx.to(torch.int64)
    perm = torch.argsort(groups, stable=True)
    expected = torch.arange(groups.numel(), device=groups.device) // GROUP_SIZE
    if not torch.equal(groups[perm], expected):
        raise ValueError(f"g_idx does not give every group {GROUP_SIZE} channels")
    if torch.equal(perm, torch.arange(groups.numel(), device=groups.device)):
        return None
    return perm.to(torch.int32)
