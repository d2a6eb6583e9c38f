"""Random GPTQ int4 weights (group 128, no act-order, packed for the kernels) at the Qwen3-8B projection shapes:
what the int4 tuner and the int4 GEMV micro-benchmark share."""

from __future__ import annotations

import torch

from engine.layers.quant.int4 import Gptq
from engine.layers.quant.int4_layout import PackedInt4
from engine.layers.quant.int4_random import RANDOM_CHECKPOINT_CONFIGS, quantized_parts

# (N, K): o_proj, down_proj, gate (or up) proj, gate|up fused, q|k|v fused.
SHAPES = {
    "4096x4096": (4096, 4096),
    "4096x12288": (4096, 12288),
    "12288x4096": (12288, 4096),
    "24576x4096": (24576, 4096),
    "6144x4096": (6144, 4096),
}


def packed_weight(n: int, k: int) -> PackedInt4:
    weight = torch.empty(n, k, device="cuda").uniform_(-(k**-0.5), k**-0.5)
    return Gptq(RANDOM_CHECKPOINT_CONFIGS["gptq"], packed=True).repack(quantized_parts(weight, "gptq"))


def packed_nbytes(p: PackedInt4) -> int:
    return sum(t.numel() * t.element_size() for t in (p.weight, p.scale, p.zero))
