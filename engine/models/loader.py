"""Builds a native model from an HF folder and loads its safetensors weights by name."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.attention.backend import AttentionBackend
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
            model = LlamaForCausalLM(cfg, backend)
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


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: Path) -> None:
    """Copy every checkpoint tensor into the parameter of the same name; all parameters must be covered."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in _checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                # NOTE: a tied lm_head is the embedding parameter itself; some checkpoints store it anyway.
                tied_head = name == "lm_head.weight" and model.config.tie_word_embeddings
                if name.endswith(_IGNORED_SUFFIXES) or tied_head:
                    continue
                if name not in params:
                    raise KeyError(f"{path.name}: unexpected weight {name!r} for {model.config.architecture}")
                params[name].copy_(f.get_tensor(name))
                loaded.add(name)
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"checkpoint in {folder} lacks weights: {sorted(missing)[:5]}")


def load_model(folder: Path, backend: AttentionBackend, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    model = build_model(ArchConfig.from_folder(folder), backend, dtype, device)
    load_weights(model, folder)
    return model
