"""GPTQ and AWQ int4 checkpoints (group size 128), dequantized at load to the model dtype.

Layouts (int32 words, 8 nibbles each, low nibble first):
- GPTQ: `qweight` [in/8, out] packs 8 input rows per word; `qzeros` [groups, out/8] packs 8 output columns;
  `scales` [groups, out]; `g_idx` [in] names the group of each input row (with act-order a permutation's groups,
  without it `i // group_size`). `w[o, i] = (q[i, o] - z[g_idx[i], o]) * scales[g_idx[i], o]`, where the v1 format
  ("checkpoint_format": "gptq", the default) stores each zero minus one and gptq_v2 stores it as it is.
- AWQ (GEMM version): `qweight` [in, out/8] and `qzeros` [groups, out/8] pack 8 output columns per word in the
  interleaved order AWQ_PACK_ORDER (nibble k holds column 8c + AWQ_PACK_ORDER[k]); `scales` [groups, out];
  `w[o, i] = (q[i, o] - z[i // group_size, o]) * scales[i // group_size, o]`.
The GPU path (a Triton dequantize-in-GEMM keeping int4 weights) is to come behind `linear_method`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from common.errors import InvalidArgumentError
from engine.layers.linear import LinearMethod
from engine.layers.quant.base import NamedTensors, QuantMethod

SUPPORTED_BITS = (4,)
SUPPORTED_GROUP_SIZES = (128,)
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_UNPACK_ORDER = torch.tensor([AWQ_PACK_ORDER.index(j) for j in range(8)])
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words [R, C] -> their nibbles as int32 in [0, 15], 8 per word along `dim` (0: [8R, C]; 1: [R, 8C])."""
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF
    rows, cols = packed.shape
    if dim == 0:
        return nibbles.permute(0, 2, 1).reshape(rows * 8, cols)
    return nibbles.reshape(rows, cols * 8)


def _check(config: Mapping[str, Any], key: str, allowed: tuple[Any, ...], default: Any = None) -> Any:
    value = config.get(key, default)
    if value not in allowed:
        raise InvalidArgumentError(
            f"quantization_config.{key}", f"{config.get('quant_method')} with {key}={value!r} is not supported "
            f"(supported: {', '.join(map(repr, allowed))})",
        )  # fmt: skip
    return value


class Int4Checkpoint(QuantMethod):
    """What GPTQ and AWQ share: the tensors of one projection gathered by prefix, dequantized at the end."""

    parts: tuple[str, ...] = ("qweight", "qzeros", "scales")
    optional_parts: tuple[str, ...] = ()

    def __init__(self, config: Mapping[str, Any]) -> None:
        _check(config, "bits", SUPPORTED_BITS)
        self.group_size: int = _check(config, "group_size", SUPPORTED_GROUP_SIZES)

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return unquantized

    def translate(self, tensors: NamedTensors) -> NamedTensors:
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in tensors:
            prefix, _, part = name.rpartition(".")
            if part in self.parts or part in self.optional_parts:
                pending.setdefault(prefix, {})[part] = tensor
            else:
                yield name, tensor
        for prefix, parts in pending.items():
            missing = [p for p in self.parts if p not in parts]
            if missing:
                raise KeyError(f"{self.name} checkpoint: {prefix} lacks {', '.join(missing)}")
            yield f"{prefix}.weight", self.dequantize(parts)

    @abstractmethod
    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """One projection's tensors -> its float32 weight [out, in]."""


class Gptq(Int4Checkpoint):
    name = "gptq"
    optional_parts = ("g_idx",)

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        checkpoint_format = _check(config, "checkpoint_format", ("gptq", "gptq_v2"), default="gptq")
        self.zero_offset = 1 if checkpoint_format == "gptq" else 0

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        q = unpack_int4(parts["qweight"], dim=0)
        zeros = unpack_int4(parts["qzeros"], dim=1) + self.zero_offset
        scales = parts["scales"].float()
        in_features = q.shape[0]
        g_idx = parts.get("g_idx")
        groups = torch.arange(in_features) // self.group_size if g_idx is None else g_idx.long()
        return ((q - zeros[groups]).float() * scales[groups]).T.contiguous()


class Awq(Int4Checkpoint):
    name = "awq"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        _check(config, "version", ("gemm", "GEMM"), default="gemm")
        _check(config, "zero_point", (True,), default=True)

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        q, zeros = unpack_int4(parts["qweight"], dim=1), unpack_int4(parts["qzeros"], dim=1)
        out_features = q.shape[1]
        columns = torch.arange(out_features)
        order = columns // 8 * 8 + _AWQ_UNPACK_ORDER[columns % 8]
        q, zeros = q[:, order], zeros[:, order]
        groups = torch.arange(q.shape[0]) // self.group_size
        return ((q - zeros[groups]).float() * parts["scales"].float()[groups]).T.contiguous()
