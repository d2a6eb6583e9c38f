"""Builds a native model from an HF folder and loads its safetensors weights by name.

Checkpoint projections that the native model runs as one GEMM (q/k/v, gate/up) land in their rows of the
`StackedLinear` that holds them; `hf_state_dict` gives the model's weights back under the checkpoint's names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.attention.backend import AttentionBackend
from engine.layers.kernels import layer_kernels
from engine.layers.linear import StackedLinear
from engine.models.arch_config import ArchConfig
from engine.models.llama import LlamaForCausalLM

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(
    cfg: ArchConfig, backend: AttentionBackend, dtype: torch.dtype, device: torch.device
) -> LlamaForCausalLM:
    """The model with freshly initialized weights, created directly on `device` in `dtype`."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg, layer_kernels(device), backend)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors checkpoint in {folder}")
    return files


def _stacked_target(model: LlamaForCausalLM, name: str) -> tuple[str, slice] | None:
    """(fused parameter name, its rows) of a checkpoint tensor that is one shard of a StackedLinear."""
    parts = name.rsplit(".", 2)
    if len(parts) != 3:
        return None
    module_path, shard_name, attr = parts
    try:
        parent = model.get_submodule(module_path)
    except AttributeError:
        return None
    for child_name, child in parent.named_children():
        if isinstance(child, StackedLinear) and shard_name in child.shard_names:
            return f"{module_path}.{child_name}.{attr}", child.shard_rows(shard_name)
    return None


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor into its parameter (or its rows of a stacked one); all must be covered."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in _checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                # NOTE: a tied lm_head is the embedding parameter itself; some checkpoints store it anyway.
                tied_head = name == "lm_head.weight" and model.config.tie_word_embeddings
                if name.endswith(_IGNORED_SUFFIXES) or tied_head:
                    continue
                target = name if name in params else None
                rows = slice(None)
                if target is None and (stacked := _stacked_target(model, name)) is not None:
                    target, rows = stacked
                if target is None:
                    raise KeyError(f"{path.name}: unexpected weight {name!r} for {model.config.architecture}")
                params[target][rows].copy_(f.get_tensor(name))
                loaded.add(name)
    missing = set(hf_names(model)) - loaded
    if missing:
        raise KeyError(f"checkpoint in {folder} lacks weights: {sorted(missing)[:5]}")


def hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's parameters under the checkpoint's names (stacked ones split into views of their shards)."""
    state: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            if isinstance(module, StackedLinear):
                parent = module_name.rsplit(".", 1)[0]
                state |= {f"{parent}.{shard}.{attr}": rows for shard, rows in module.shards(param).items()}
            else:
                state[f"{module_name}.{attr}" if module_name else attr] = param
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def hf_names(model: LlamaForCausalLM) -> list[str]:
    """Every checkpoint tensor name the model needs."""
    return list(hf_state_dict(model))


def load_model(folder: Path, backend: AttentionBackend, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    model = build_model(ArchConfig.from_folder(folder), backend, dtype, device)
    load_weights(model, folder)
    return model
