"""GPTQ and AWQ int4 checkpoints (group size 128): kept packed on CUDA, dequantized at load elsewhere.

Layouts (int32 words, 8 nibbles each, low nibble first):
- GPTQ: `qweight` [in/8, out] packs 8 input rows per word; `qzeros` [groups, out/8] packs 8 output columns;
  `scales` [groups, out]; `g_idx` [in] names the group of each input row (with act-order a permutation's groups,
  without it `i // group_size`). `w[o, i] = (q[i, o] - z[g_idx[i], o]) * scales[g_idx[i], o]`, where the v1 format
  ("checkpoint_format": "gptq", the default) stores each zero minus one and gptq_v2 stores it as it is.
- AWQ (GEMM version): `qweight` [in, out/8] and `qzeros` [groups, out/8] pack 8 output columns per word in the
  interleaved order AWQ_PACK_ORDER (nibble k holds column 8c + AWQ_PACK_ORDER[k]); `scales` [groups, out];
  `w[o, i] = (q[i, o] - z[i // group_size, o]) * scales[i // group_size, o]`.
`translate` reads both into their nibbles, zeros, scales and groups, then either dequantizes them (CPU: the model's
float weight) or repacks them into the kernels' layout (engine.layers.quant.int4_layout: act-order folded into an
input permutation), which `Int4LinearMethod` runs on the Triton kernels of engine.layers.quant.triton_int4.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import torch

from common.errors import InvalidArgumentError
from engine.layers.linear import Linear, LinearMethod
from engine.layers.quant import int4_random
from engine.layers.quant.base import NamedTensors, QuantMethod
from engine.layers.quant.int4_layout import GROUP_SIZE, PackedInt4, act_order_perm, pack_kernel_order
from engine.layers.quant.int4_random import AWQ_PACK_ORDER

SUPPORTED_BITS = (4,)
SUPPORTED_GROUP_SIZES = (GROUP_SIZE,)
_AWQ_UNPACK_ORDER = torch.tensor([AWQ_PACK_ORDER.index(j) for j in range(8)])
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
PACKED_PARAMS = ("weight", "weight_scale", "weight_zero", "input_perm")
"""The parameters of a packed int4 layer (int4_layout's weight, scale, zero, perm); input_perm is per input."""


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
            f"quantization_config.{key}",
            f"{config.get('quant_method')} with {key}={value!r} is not supported "
            f"(supported: {', '.join(map(repr, allowed))})",
        )
    return value


class Int4LinearMethod(LinearMethod):
    """Packed int4 weights (int4_layout) run by the Triton GEMV/GEMM kernels; act-order layers keep their
    `input_perm`, the others drop it once loaded."""

    input_params = ("input_perm",)
    # NOTE: the tuned one-row kernels of the 8B shape's qkv, o and gate_up launch early (int4_tuned.json's PDL).
    gemv_pdl = True

    def __init__(self) -> None:
        from engine.layers.quant.triton_int4 import int4_linear, int4_linear_silu_and_mul

        self.kernel = int4_linear
        self.kernel_silu_and_mul = int4_linear_silu_and_mul
        self.packed: dict[Linear, PackedInt4] = {}

    def create_weights(self, layer: Linear) -> None:
        n, k = layer.out_features, layer.in_features
        if k % GROUP_SIZE:
            raise InvalidArgumentError("quantization", f"int4 layers need in_features % {GROUP_SIZE} == 0, got {k}")
        groups = k // GROUP_SIZE
        shapes = {
            "weight": ((n, k // 8), torch.int32),
            "weight_scale": ((n, groups), torch.float16),
            "weight_zero": ((n, groups), torch.uint8),
            "input_perm": ((k,), torch.int32),
        }
        for name, (shape, dtype) in shapes.items():
            layer.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False))

    def process_weights_after_loading(self, layer: Linear) -> None:
        perm = layer.get_parameter("input_perm")
        identity = torch.equal(perm, torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device))
        if identity:
            layer.register_parameter("input_perm", None)
        scale, zero = layer.get_parameter("weight_scale"), layer.get_parameter("weight_zero")
        self.packed[layer] = PackedInt4(layer.weight, scale, zero, None if identity else perm)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.packed[layer], layer.bias)

    def apply_silu_and_mul(
        self, layer: Linear, x: torch.Tensor, silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        return self.kernel_silu_and_mul(x, self.packed[layer], layer.bias)


class Int4Checkpoint(QuantMethod):
    """What GPTQ and AWQ share: the tensors of one projection gathered by prefix, then dequantized (CPU) or
    repacked for the int4 kernels (`packed`: CUDA, or a test under Triton's interpreter)."""

    parts: tuple[str, ...] = ("qweight", "qzeros", "scales")
    optional_parts: tuple[str, ...] = ()

    def __init__(self, config: Mapping[str, Any], packed: bool = False) -> None:
        _check(config, "bits", SUPPORTED_BITS)
        self.group_size: int = _check(config, "group_size", SUPPORTED_GROUP_SIZES)
        self.packed = packed

    def linear_method(self, unquantized: LinearMethod) -> LinearMethod:
        return Int4LinearMethod() if self.packed else unquantized

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
            if self.packed:
                packed = self.repack(parts)
                identity = torch.arange(packed.weight.shape[1] * 8, dtype=torch.int32, device=packed.weight.device)
                perm = identity if packed.perm is None else packed.perm
                values = (packed.weight, packed.scale, packed.zero, perm)
                yield from ((f"{prefix}.{param}", value) for param, value in zip(PACKED_PARAMS, values, strict=True))
            else:
                yield f"{prefix}.weight", self.dequantize(parts)

    def random_checkpoint(self, shapes: Mapping[str, tuple[int, int]], device: torch.device) -> NamedTensors:
        return int4_random.random_checkpoint(shapes, self.name, device)

    @abstractmethod
    def nibbles(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One projection's tensors -> (q [in, out], zeros [groups, out], group of each input row [in]), int64."""

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """One projection's tensors -> its float32 weight [out, in]."""
        q, zeros, groups = self.nibbles(parts)
        return ((q - zeros[groups]).float() * parts["scales"].float()[groups]).T.contiguous()

    def repack(self, parts: dict[str, torch.Tensor]) -> PackedInt4:
        """One projection's tensors -> the int4 kernels' layout (int4_layout), the same integers and scales."""
        q, zeros, groups = self.nibbles(parts)
        perm = act_order_perm(groups)
        q_kernel = (q if perm is None else q[perm.long()]).T
        scale = parts["scales"].to(torch.float16).T.contiguous()
        return PackedInt4(pack_kernel_order(q_kernel), scale, zeros.T.to(torch.uint8).contiguous(), perm)


class Gptq(Int4Checkpoint):
    name = "gptq"
    optional_parts = ("g_idx",)

    def __init__(self, config: Mapping[str, Any], packed: bool = False) -> None:
        super().__init__(config, packed)
        checkpoint_format = _check(config, "checkpoint_format", ("gptq", "gptq_v2"), default="gptq")
        self.zero_offset = 1 if checkpoint_format == "gptq" else 0

    def nibbles(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = unpack_int4(parts["qweight"], dim=0).long()
        zeros = unpack_int4(parts["qzeros"], dim=1).long() + self.zero_offset
        g_idx = parts.get("g_idx")
        in_features = q.shape[0]
        groups = torch.arange(in_features, device=q.device) // self.group_size if g_idx is None else g_idx.long()
        return q, zeros, groups


class Awq(Int4Checkpoint):
    name = "awq"

    def __init__(self, config: Mapping[str, Any], packed: bool = False) -> None:
        super().__init__(config, packed)
        _check(config, "version", ("gemm", "GEMM"), default="gemm")
        _check(config, "zero_point", (True,), default=True)

    def nibbles(self, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, zeros = unpack_int4(parts["qweight"], dim=1).long(), unpack_int4(parts["qzeros"], dim=1).long()
        columns = torch.arange(q.shape[1], device=q.device)
        order = columns // 8 * 8 + _AWQ_UNPACK_ORDER.to(q.device)[columns % 8]
        groups = torch.arange(q.shape[0], device=q.device) // self.group_size
        return q[:, order], zeros[:, order], groups
