"""The sparse MoE block of Qwen3-MoE and Mixtral: a router picks each token's top-k experts, each expert is a SwiGLU
MLP, and the block returns the routing-weighted sum of the experts' outputs.

Weights: the router [E, H] (replicated), and the experts stacked as `w13` [E_local, 2 I_local, H] (gate rows, then up
rows) and `w2` [E_local, H, I_local]; `checkpoint_views` maps the checkpoint's per-expert tensors
(`<prefix>.experts.<e>.<gate|up|down>.weight`, as transformers' `save_pretrained` writes them) onto views of them.

Parallelism (over the TP group; the activations entering the block are replicated on every rank):
- tensor parallel (default): every rank holds every expert, its slice of each expert's intermediate rows (as a
  dense MLP's gate/up/down split);
- expert parallel (`enable_expert_parallel`): every rank holds num_experts / tp_size experts whole.
Either way each rank computes its part of every token's output and one all-reduce sums the parts. Expert parallel
as this simplest correct form: each rank routes all tokens (the router is replicated) and skips the pairs of experts
it does not hold; no all-to-all dispatch (that pays only once activations are not replicated, i.e. with data
parallel attention).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.layers.kernels import LayerKernels, moe_sync_counters
from engine.layers.weight_init import initialized
from engine.models.moe_config import MoEConfig
from engine.parallel.communicator import Communicator
from engine.parallel.layers import CheckpointSlice

CheckpointViews = dict[str, tuple[torch.Tensor, CheckpointSlice | None]]


def _uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(initialized(torch.empty(shape), lambda t: t.uniform_(-bound, bound)), requires_grad=False)


class SparseMoeBlock(nn.Module):
    """Holds its parameters itself (no submodules): their checkpoint names come from `checkpoint_views` only."""

    def __init__(self, moe: MoEConfig, hidden_size: int, kernels: LayerKernels, comm: Communicator) -> None:
        super().__init__()
        self.moe, self.kernels, self.comm = moe, kernels, comm
        rank = comm.rank
        if comm.expert_parallel:
            self.experts, self.rows = rank.split(moe.num_experts), slice(0, moe.moe_intermediate_size)
        else:
            self.experts, self.rows = slice(0, moe.num_experts), rank.split(moe.moe_intermediate_size)
        num_local, intermediate = self.experts.stop - self.experts.start, self.rows.stop - self.rows.start
        self.intermediate = intermediate
        self.gate_weight = _uniform((moe.num_experts, hidden_size), hidden_size)
        self.w13 = _uniform((num_local, 2 * intermediate, hidden_size), hidden_size)
        self.w2 = _uniform((num_local, hidden_size, intermediate), moe.moe_intermediate_size)
        self.sync: torch.Tensor
        self.register_buffer("sync", moe_sync_counters(hidden_size), persistent=False)

    def checkpoint_views(self) -> CheckpointViews:
        """Checkpoint tensor name (relative to the decoder layer) -> (the view of a parameter it loads into, the part
        of it this rank reads)."""
        prefix, (gate, up, down), i = self.moe.checkpoint_prefix, self.moe.expert_names, self.intermediate
        views: CheckpointViews = {f"{prefix}.gate.weight": (self.gate_weight, None)}
        for local, expert in enumerate(range(self.experts.start, self.experts.stop)):
            name = f"{prefix}.experts.{expert}"
            views[f"{name}.{gate}.weight"] = (self.w13[local, :i], CheckpointSlice(0, self.rows))
            views[f"{name}.{up}.weight"] = (self.w13[local, i:], CheckpointSlice(0, self.rows))
            views[f"{name}.{down}.weight"] = (self.w2[local], CheckpointSlice(1, self.rows))
        return views

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moe = self.moe
        router_logits = self.kernels.linear(x, self.gate_weight, None)
        out = self.kernels.moe(
            x,
            router_logits,
            self.w13,
            self.w2,
            moe.num_experts_per_tok,
            moe.norm_topk_prob,
            self.experts.start,
            self.sync,
        )
        return self.comm.all_reduce(out)


def moe_checkpoint_views(model: nn.Module) -> CheckpointViews:
    """Every MoE block's checkpoint views in `model`, under full checkpoint names."""
    views: CheckpointViews = {}
    for name, module in model.named_modules():
        if isinstance(module, SparseMoeBlock):
            parent = name.rsplit(".", 1)[0]
            views |= {f"{parent}.{key}": view for key, view in module.checkpoint_views().items()}
    return views
