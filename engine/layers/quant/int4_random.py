"""Random-weight GPTQ and AWQ checkpoints made in memory (load_format="dummy"): benchmarks run an int4 8B shape
through the same `translate` and loader as a real checkpoint, without writing one.

Round-to-nearest per group of 128 input channels, as tests/engine/int4_reference.py does (which checks these
tensors bit for bit): GPTQ symmetric (zero 8, scale = absmax * 2 / 15) in the v1 layout without act-order;
AWQ asymmetric (range [min(w, 0), max(w, 0)] over 15 steps, zero in 1..15) in the GEMM layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from engine.layers.quant.int4_layout import GROUP_SIZE

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
RANDOM_CHECKPOINT_CONFIGS: dict[str, dict[str, object]] = {
    "gptq": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": GROUP_SIZE,
        "desc_act": False,
        "sym": True,
        "checkpoint_format": "gptq",
    },
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP_SIZE, "zero_point": True, "version": "gemm"},
}
"""The quantization_config a random-weight model of each method stands for."""


def pack_nibbles(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """Pack 8 values (0..15) along `dim` into one int32 word: nibble k holds element 8c + order[k]."""
    v = values.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)[..., list(order)]
    words = (v << torch.arange(0, 32, 4, device=v.device)).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def quantize_groups(weight: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q [out, in] in 0..15, zeros [groups, out] in 0..15, float16 scales [groups, out])."""
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"int4 groups of {GROUP_SIZE} need in_features % {GROUP_SIZE} == 0, got {in_features}")
    w = weight.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    if symmetric:
        scale = (w.abs().amax(dim=2) * 2 / 15).to(torch.float16)
        zero = torch.full_like(scale, 8, dtype=torch.int64)
    else:
        low, high = w.amin(dim=2).clamp(max=0), w.amax(dim=2).clamp(min=0)
        scale = ((high - low) / 15).to(torch.float16)
        zero = torch.round(-low / scale.float()).clamp(1, 15).to(torch.int64)
    q = (torch.round(w / scale.float()[..., None]) + zero[..., None]).clamp(0, 15).to(torch.int64)
    return q.reshape(out_features, in_features), zero.T.contiguous(), scale.T.contiguous()


def quantized_parts(weight: torch.Tensor, method: str) -> dict[str, torch.Tensor]:
    """One projection's weight [out, in] -> its checkpoint tensors in `method`'s layout (see module doc)."""
    q, zeros, scales = quantize_groups(weight, symmetric=method == "gptq")
    if method == "gptq":
        g_idx = torch.arange(weight.shape[1], dtype=torch.int32, device=weight.device) // GROUP_SIZE
        return {"qweight": pack_nibbles(q.T, 0), "qzeros": pack_nibbles(zeros - 1, 1), "scales": scales, "g_idx": g_idx}
    return {
        "qweight": pack_nibbles(q.T, 1, AWQ_PACK_ORDER),
        "qzeros": pack_nibbles(zeros, 1, AWQ_PACK_ORDER),
        "scales": scales,
    }


def random_checkpoint(
    shapes: Mapping[str, tuple[int, int]], method: str, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """For each projection prefix and its (out, in): uniform random weights in +-1/sqrt(in) (nn.Linear's
    initialization), quantized into `method`'s checkpoint tensors, named `<prefix>.qweight` etc."""
    for prefix, (out_features, in_features) in shapes.items():
        bound = in_features**-0.5
        weight = torch.empty(out_features, in_features, device=device).uniform_(-bound, bound)
        for part, tensor in quantized_parts(weight, method).items():
            yield f"{prefix}.{part}", tensor
