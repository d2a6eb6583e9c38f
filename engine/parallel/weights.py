"""Per-rank weight loading: each rank reads only its slices of the checkpoint's safetensors tensors
(`safe_open(...).get_slice`), so no rank materializes the whole model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.layers.linear import StackedLinear
from engine.models.moe import SparseMoeBlock
from engine.parallel.layers import CheckpointSlice, ShardedModule

_Target = tuple[torch.Tensor, CheckpointSlice | None]


def _module_targets(module_name: str, module: nn.Module) -> dict[str, _Target]:
    targets: dict[str, _Target] = {}
    if isinstance(module, SparseMoeBlock):
        parent = module_name.rsplit(".", 1)[0]
        return {f"{parent}.{name}": target for name, target in module.checkpoint_views().items()}
    for attr, param in module.named_parameters(recurse=False):
        if isinstance(module, StackedLinear):
            parent = module_name.rsplit(".", 1)[0]
            for shard, rows in module.shards(param).items():
                assert isinstance(module, ShardedModule)
                targets[f"{parent}.{shard}.{attr}"] = (rows, module.checkpoint_slice(shard, attr))
        else:
            part = module.checkpoint_slice(None, attr) if isinstance(module, ShardedModule) else None
            targets[f"{module_name}.{attr}"] = (param, part)
    return targets


def checkpoint_targets(model: nn.Module, tie_word_embeddings: bool) -> dict[str, _Target]:
    """Checkpoint tensor name -> (the parameter, or rows of it, that it loads into; the slice this rank reads).

    A tied lm_head on a stage without the embedding loads the embedding's tensor itself."""
    targets: dict[str, _Target] = {}
    for module_name, module in model.named_modules():
        targets |= _module_targets(module_name, module)
    if tie_word_embeddings:
        head = targets.pop("lm_head.weight", None)
        if head is not None and "model.embed_tokens.weight" not in targets:
            targets["model.embed_tokens.weight"] = head
    return targets


def _read(tensor_slice: object, part: CheckpointSlice | None) -> torch.Tensor:
    if part is None:
        return tensor_slice[:]  # type: ignore[index]
    index = (slice(None),) * part.dim + (part.index,)
    tensor: torch.Tensor = tensor_slice[index]  # type: ignore[index]
    return torch.zeros_like(tensor) if part.zero else tensor


@torch.no_grad()
def load_sharded_weights(model: nn.Module, files: list[Path], tie_word_embeddings: bool) -> None:
    """Copy this rank's slice of every checkpoint tensor it holds; tensors of other stages are never read."""
    targets = checkpoint_targets(model, tie_word_embeddings)
    loaded: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                target = targets.get(name)
                if target is None:
                    continue
                param, part = target
                param.copy_(_read(f.get_slice(name), part))
                loaded.add(name)
    missing = set(targets) - loaded
    if missing:
        raise KeyError(f"checkpoint in {files[0].parent} lacks weights: {sorted(missing)[:5]}")
