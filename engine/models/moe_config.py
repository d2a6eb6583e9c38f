"""The mixture-of-experts facts of an HF `config.json` (Qwen3-MoE, Mixtral): how many experts, how many each token
goes to, how their weights are normalized, and which decoder layers route at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM")


@dataclass(frozen=True, slots=True)
class MoEConfig:
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    """Each expert's intermediate size (the dense layers, if any, use the model's `intermediate_size`)."""
    norm_topk_prob: bool
    """Renormalize the top-k softmax probabilities to sum to 1 (Mixtral always; Qwen3-MoE per checkpoint)."""
    sparse_layers: tuple[int, ...]
    """The decoder layers whose MLP is the expert block; the others keep a dense MLP."""
    checkpoint_prefix: str
    """The block's module name in the checkpoint: `mlp` (Qwen3-MoE) or `block_sparse_moe` (Mixtral)."""
    expert_names: tuple[str, str, str]
    """The checkpoint's per-expert projections: (gate, up, down)."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any], arch: str, num_layers: int) -> MoEConfig:
        # NOTE: transformers 5 writes `num_local_experts` for Qwen3-MoE too; the hub's checkpoints say `num_experts`.
        num_experts = raw.get("num_experts") or raw["num_local_experts"]
        if arch == "MixtralForCausalLM":
            return cls(
                num_experts=num_experts,
                num_experts_per_tok=raw.get("num_experts_per_tok", 2),
                moe_intermediate_size=raw["intermediate_size"],
                norm_topk_prob=True,
                sparse_layers=tuple(range(num_layers)),
                checkpoint_prefix="block_sparse_moe",
                expert_names=("w1", "w3", "w2"),
            )
        step = raw.get("decoder_sparse_step", 1)
        dense = set(raw.get("mlp_only_layers") or ())
        return cls(
            num_experts=num_experts,
            num_experts_per_tok=raw.get("num_experts_per_tok", 8),
            moe_intermediate_size=raw["moe_intermediate_size"],
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            sparse_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0),
            checkpoint_prefix="mlp",
            expert_names=("gate_proj", "up_proj", "down_proj"),
        )
