"""The KV layout descriptor both sides compare before any byte moves."""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, fields
from typing import TYPE_CHECKING, Any, Self

from common.errors import InvalidArgumentError
from kv_transfer.state import LayoutMismatchError

if TYPE_CHECKING:
    import torch

POOL_DIMS = ("num_blocks", "num_layers", "kv", "block_size", "num_kv_heads", "head_dim")

# NOTE: a table rather than torch's dtypes, so that the router, which carries KV targets, never imports torch.
_OPTIONAL_KEYS = {"k_scale", "v_scale", "tp_rank", "tp_size", "pp_rank", "pp_size"}

DTYPE_NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
"""Bytes per element of each KV cache dtype, by its torch name."""


@dataclass(frozen=True, slots=True)
class KVRank:
    """Which slice of a parallel pod's KV one pool holds: TP rank `tp_rank` of `tp_size` (its share of the KV heads)
    in pipeline stage `pp_rank` of `pp_size` (its stage's layers). A one-device pod is rank 0 of 1 and 1."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self) -> None:
        for name, size in (("tensor_parallel_size", self.tp_size), ("pipeline_parallel_size", self.pp_size)):
            if not isinstance(size, int) or size <= 0:
                raise InvalidArgumentError(name, f"must be a positive int, got {size!r}")
        for name, rank, size in (("tp_rank", self.tp_rank, self.tp_size), ("pp_rank", self.pp_rank, self.pp_size)):
            if not isinstance(rank, int) or not 0 <= rank < size:
                raise InvalidArgumentError(name, f"must be an int in [0, {size}), got {rank!r}")

    @property
    def world_rank(self) -> int:
        """The rank's index in a pod's list of pools: the TP ranks of one stage are neighbours."""
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @classmethod
    def of_world_rank(cls, world_rank: int, tp_size: int, pp_size: int) -> Self:
        return cls(world_rank % tp_size, tp_size, world_rank // tp_size, pp_size)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What one KV block holds. A pool is [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim],
    so one block is `block_nbytes` contiguous bytes. An fp8 pool stores `K / k_scale` and `V / v_scale` (per-tensor
    scales, 1.0 for a pool in the model dtype): two pools with other scales hold other numbers for the same bytes.
    A parallel pod's pool is one rank's slice (`rank`): its stage's layers and its share of the KV heads."""

    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    k_scale: float = 1.0
    v_scale: float = 1.0
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NBYTES:
            raise InvalidArgumentError("dtype", f"not a KV cache dtype: {self.dtype!r} (one of {sorted(DTYPE_NBYTES)})")
        for name in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(name, f"must be a positive int, got {value!r}")
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            if not isinstance(value, float) or not value > 0:
                raise InvalidArgumentError(name, f"must be a positive float, got {value!r}")
        KVRank(self.tp_rank, self.tp_size, self.pp_rank, self.pp_size)

    @property
    def rank(self) -> KVRank:
        return KVRank(self.tp_rank, self.tp_size, self.pp_rank, self.pp_size)

    @property
    def block_nbytes(self) -> int:
        elements = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
        return elements * DTYPE_NBYTES[self.dtype]

    @classmethod
    def from_pool(
        cls, pool: torch.Tensor, block_size: int, k_scale: float = 1.0, v_scale: float = 1.0, rank: KVRank | None = None
    ) -> KVLayout:
        """The layout of a contiguous pool tensor shaped like POOL_DIMS (holding K / k_scale, V / v_scale), the
        slice `rank` of its pod's KV."""
        if pool.dim() != len(POOL_DIMS) or pool.shape[2] != 2:
            raise InvalidArgumentError("pool", f"must be shaped {list(POOL_DIMS)} (kv = 2), got {list(pool.shape)}")
        if pool.shape[3] != block_size:
            raise InvalidArgumentError("block_size", f"{block_size} differs from the pool's {pool.shape[3]}")
        if not pool.is_contiguous():
            raise InvalidArgumentError("pool", "must be contiguous, so that each block is one run of bytes")
        dtype = str(pool.dtype).removeprefix("torch.")
        shape = (pool.shape[1], pool.shape[4], pool.shape[5])
        return cls(dtype, block_size, *shape, k_scale, v_scale, *astuple(rank or KVRank()))

    def check_compatible(self, other: KVLayout) -> None:
        """Raise LayoutMismatchError naming every field where `other` differs from this layout."""
        differing = [
            f.name
            for f, ours, theirs in zip(fields(self), astuple(self), astuple(other), strict=True)
            if ours != theirs
        ]
        if differing:
            details = ", ".join(f"{name}: {getattr(self, name)!r} vs {getattr(other, name)!r}" for name in differing)
            raise LayoutMismatchError(f"KV layouts differ in {details}", differing)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVLayout:
        """Inverse of `to_dict`; unknown or missing keys are an InvalidArgumentError, but for the scales and the rank,
        which a peer from before fp8 KV or parallel pods does not send (they read as 1.0 and rank 0 of 1)."""
        names = {f.name for f in fields(cls)}
        required = names - _OPTIONAL_KEYS
        if not required <= set(data) <= names:
            raise InvalidArgumentError("layout", f"expected keys {sorted(names)}, got {sorted(data)}")
        return cls(**data)


def check_transfer_layouts(prefill: KVLayout, decode: KVLayout) -> None:
    """Raise LayoutMismatchError unless a prefill pool of layout `prefill` may ship into a decode pool of layout
    `decode`: parallel sizes first (every other field follows from them), then every field.

    NOTE: pods of other TP/PP sizes are refused, not re-sliced: each rank ships its slice to the same rank.
    """
    for name, field_name, ours, theirs in (
        ("tensor_parallel_size", "tp_size", prefill.tp_size, decode.tp_size),
        ("pipeline_parallel_size", "pp_size", prefill.pp_size, decode.pp_size),
    ):
        if ours != theirs:
            raise LayoutMismatchError(
                f"{name} {ours} on the prefill pod differs from {theirs} on the decode pod (KV moves rank to rank "
                "between pods of the same sizes)",
                [field_name],
            )
    prefill.check_compatible(decode)
