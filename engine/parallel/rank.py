"""Where one worker sits in the tensor x pipeline grid, and which part of the model it therefore holds."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidArgumentError
from engine.models.arch_config import ArchConfig
from kv_transfer.layout import KVRank


@dataclass(frozen=True, slots=True)
class ParallelRank(KVRank):
    """A worker's place in the grid (kv_transfer's KVRank: world rank = pp_rank * tp_size + tp_rank, the TP ranks of
    one stage neighbours) and the parts of the model that place holds."""

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def split(self, total: int) -> slice:
        """This TP rank's equal part of `total` (which the sizes check made divisible)."""
        size = total // self.tp_size
        return slice(self.tp_rank * size, (self.tp_rank + 1) * size)

    def kv_heads(self, num_kv_heads: int) -> slice:
        """This rank's KV heads: an equal part, or with more ranks than KV heads the one head its query heads
        read (replicated over tp_size // num_kv_heads ranks)."""
        start = self.tp_rank * num_kv_heads // self.tp_size
        return slice(start, start + max(1, num_kv_heads // self.tp_size))

    def stage_layers(self, num_layers: int) -> range:
        """This stage's decoder layers: equal parts, the first `num_layers % pp_size` stages one more."""
        base, extra = divmod(num_layers, self.pp_size)
        start = self.pp_rank * base + min(self.pp_rank, extra)
        return range(start, start + base + (self.pp_rank < extra))


def check_parallel_sizes(arch: ArchConfig, tp_size: int, pp_size: int, expert_parallel: bool = False) -> None:
    """Raise InvalidArgumentError naming the model field that `tp_size` / `pp_size` cannot split (with
    `expert_parallel`, an MoE model's experts go whole to the TP ranks, else each expert is split)."""
    sizes = [
        ("num_attention_heads", arch.num_heads),
        ("vocab_size", arch.vocab_size),
        ("intermediate_size", arch.intermediate_size),
    ]
    if arch.moe is not None:
        sizes.append(
            ("num_experts", arch.moe.num_experts)
            if expert_parallel
            else ("moe_intermediate_size", arch.moe.moe_intermediate_size)
        )
    for name, value in sizes:
        if value % tp_size:
            raise InvalidArgumentError(
                "tensor_parallel_size", f"{name} {value} is not divisible by tensor_parallel_size {tp_size}"
            )
    kv = arch.num_kv_heads
    if kv % tp_size and tp_size % kv:
        raise InvalidArgumentError(
            "tensor_parallel_size",
            f"num_key_value_heads {kv} neither divides nor is divisible by tensor_parallel_size {tp_size}",
        )
    if arch.num_layers < pp_size:
        raise InvalidArgumentError(
            "pipeline_parallel_size",
            f"num_hidden_layers {arch.num_layers} is fewer than pipeline_parallel_size {pp_size}",
        )
