"""A reference int4 quantizer that writes GPTQ and AWQ checkpoints in their published layouts.

Round-to-nearest per group of 128 input columns (the GPTQ error-compensation pass and AWQ's activation-aware
scaling change which integers are chosen, not how they are stored). Packing follows the formats' descriptions:
- GPTQ: qweight int32 [in/8, out], input row i in bits 4*(i % 8) of word i // 8; qzeros int32 [groups, out/8],
  output column o in bits 4*(o % 8); scales fp16 [groups, out]; g_idx int32 [in]; v1 stores zero - 1.
  Act-order quantizes the columns in a permuted order, and group j // 128 of that order is g_idx of column perm[j].
- AWQ (GEMM): qweight int32 [in, out/8] and qzeros int32 [groups, out/8] pack output columns 8c + ORDER[k] in
  bits 4k, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; scales fp16 [groups, out]; group of input row i is i // 128.
Written independently of engine.layers.quant: numpy bit twiddling on the integer matrices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

GROUP_SIZE = 128
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


@dataclass(frozen=True)
class Int4Format:
    method: str  # gptq | awq
    act_order: bool = False
    symmetric: bool = True
    checkpoint_format: str = "gptq"  # gptq (v1, zero - 1) | gptq_v2


def _groups(in_features: int, act_order: bool, rng: np.random.Generator) -> np.ndarray:
    order = rng.permutation(in_features) if act_order else np.arange(in_features)
    g_idx = np.empty(in_features, dtype=np.int64)
    g_idx[order] = np.arange(in_features) // GROUP_SIZE
    return g_idx


def _quantize(w: np.ndarray, g_idx: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [out, in] -> (q [out, in] in 0..15, zeros [groups, out] in 0..15, fp16 scales [groups, out])."""
    num_groups = int(g_idx.max()) + 1
    q = np.empty(w.shape, dtype=np.int64)
    zeros = np.empty((num_groups, w.shape[0]), dtype=np.int64)
    scales = np.empty((num_groups, w.shape[0]), dtype=np.float16)
    for g in range(num_groups):
        cols = w[:, g_idx == g]
        if symmetric:
            scale = (np.abs(cols).max(axis=1) * 2 / 15).astype(np.float16)
            zero = np.full(w.shape[0], 8)
        else:
            low, high = np.minimum(cols.min(axis=1), 0), np.maximum(cols.max(axis=1), 0)
            scale = ((high - low) / 15).astype(np.float16)
            zero = np.clip(np.round(-low / scale.astype(np.float32)), 1, 15).astype(np.int64)
        scales[g], zeros[g] = scale, zero
        q[:, g_idx == g] = np.clip(np.round(cols / scale.astype(np.float32)[:, None]) + zero[:, None], 0, 15)
    return q, zeros, scales


def _pack(values: np.ndarray, axis: int, order: list[int]) -> np.ndarray:
    """Pack 8 values along `axis` into one int32: the k-th nibble holds element 8c + order[k]."""
    v = np.moveaxis(values.astype(np.uint32), axis, 0)
    words = np.zeros((v.shape[0] // 8, *v.shape[1:]), dtype=np.uint32)
    for k, src in enumerate(order):
        words |= (v[src::8] & 0xF) << np.uint32(4 * k)
    return np.moveaxis(words, 0, axis).view(np.int32)


def quantize_projection(
    weight: torch.Tensor, fmt: Int4Format, rng: np.random.Generator
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One projection's weight [out, in] -> (its checkpoint tensors by suffix, its dequantized float32 weight)."""
    w = weight.float().numpy()
    in_features = w.shape[1]
    g_idx = _groups(in_features, fmt.act_order and fmt.method == "gptq", rng)
    q, zeros, scales = _quantize(w, g_idx, fmt.symmetric)
    dequantized = (q - zeros[g_idx].T).astype(np.float32) * scales[g_idx].T.astype(np.float32)
    identity = list(range(8))
    if fmt.method == "gptq":
        stored_zeros = zeros - (1 if fmt.checkpoint_format == "gptq" else 0)
        tensors = {
            "qweight": _pack(q.T, 0, identity),
            "qzeros": _pack(stored_zeros, 1, identity),
            "scales": scales,
            "g_idx": g_idx.astype(np.int32),
        }
    else:
        tensors = {"qweight": _pack(q.T, 1, AWQ_ORDER), "qzeros": _pack(zeros, 1, AWQ_ORDER), "scales": scales}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, torch.from_numpy(dequantized)


def quantization_config(fmt: Int4Format, **overrides: object) -> dict[str, object]:
    if fmt.method == "gptq":
        config = {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP_SIZE,
            "desc_act": fmt.act_order,
            "sym": fmt.symmetric,
            "checkpoint_format": fmt.checkpoint_format,
        }
    else:
        config = {"quant_method": "awq", "bits": 4, "group_size": GROUP_SIZE, "zero_point": True, "version": "gemm"}
    return {**config, **overrides}


def write_int4_checkpoint(float_folder: Path, out: Path, fmt: Int4Format, seed: int = 0) -> dict[str, torch.Tensor]:
    """Quantize every decoder projection of the float checkpoint in `float_folder` into `out` (config.json with
    quantization_config + model.safetensors); returns the float32 weights the quantized checkpoint stands for."""
    rng = np.random.default_rng(seed)
    source = load_file(str(float_folder / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    expected: dict[str, torch.Tensor] = {}
    # NOTE: projections of one input (q, k, v; gate, up) share one act-order, as GPTQ's (from that input's Hessian).
    order_seeds: dict[str, int] = {}
    for name, tensor in source.items():
        prefix, _, attr = name.rpartition(".")
        parent, _, projection = prefix.rpartition(".")
        if attr == "weight" and projection in PROJECTIONS:
            shared = f"{parent}.{SHARED_INPUT.get(projection, projection)}"
            order_seed = order_seeds.setdefault(shared, int(rng.integers(2**32)))
            parts, expected[name] = quantize_projection(tensor, fmt, np.random.default_rng(order_seed))
            tensors |= {f"{prefix}.{suffix}": value for suffix, value in parts.items()}
        else:
            tensors[name], expected[name] = tensor, tensor.float()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((float_folder / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config(fmt)}))
    return expected
