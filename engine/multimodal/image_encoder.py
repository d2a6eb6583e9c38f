"""LLaVA's image encoder: the CLIP tower's feature layers (CLS dropped unless "full"), then the projector
(linear, activation, linear) into the decoder's embedding space; and its weights from the checkpoint.

Checkpoints name the encoder `vision_tower.*` / `multi_modal_projector.*` (transformers' own saves), with an optional
`model.` prefix (its newer layout) and `vision_model.` inside the tower (llava-hf's hub checkpoints); all load here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.multimodal.clip_vision import CLIPVisionTower, activation
from engine.multimodal.vlm_config import VisionLanguageConfig

_ENCODER_NAME = re.compile(r"^(?:model\.)?(vision_tower|multi_modal_projector)\.(?:vision_model\.)?(.*)$")


class LlavaProjector(nn.Module):
    def __init__(self, in_features: int, hidden_size: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, hidden_size, bias=bias)
        self.act = activation(act)
        self.linear_2 = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaImageEncoder(nn.Module):
    """Pixel values [B, C, H, W] -> image embeddings [B, num_image_tokens, text hidden size]."""

    def __init__(self, cfg: VisionLanguageConfig) -> None:
        super().__init__()
        self.config = cfg
        self.vision_tower = CLIPVisionTower(cfg.vision, cfg.feature_layers)
        in_features = cfg.vision.hidden_size * len(cfg.feature_layers)
        self.multi_modal_projector = LlavaProjector(
            in_features, cfg.text_hidden_size, cfg.projector_act, cfg.projector_bias
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        states = self.vision_tower(pixel_values)
        if not self.config.keep_cls:
            states = [s[:, 1:] for s in states]
        return self.multi_modal_projector(torch.cat(states, dim=-1))


def encoder_tensor_name(checkpoint_name: str) -> str | None:
    """The encoder's parameter name of a checkpoint tensor; None for a tensor of the text decoder."""
    match = _ENCODER_NAME.match(checkpoint_name)
    return None if match is None else f"{match.group(1)}.{match.group(2)}"


@torch.no_grad()
def load_image_encoder(
    folder: Path, files: list[Path], cfg: VisionLanguageConfig, dtype: torch.dtype, device: torch.device
) -> LlavaImageEncoder:
    """The encoder with the checkpoint's weights (layers past the deepest feature layer are skipped)."""
    with torch.device(device):
        encoder = LlavaImageEncoder(cfg).to(dtype).eval()
    params = dict(encoder.named_parameters())
    loaded: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                target = encoder_tensor_name(name)
                if target is not None and target in params:
                    params[target].copy_(f.get_tensor(name))
                    loaded.add(target)
    missing = set(params) - loaded
    if missing:
        raise KeyError(f"checkpoint in {folder} lacks image encoder weights: {sorted(missing)[:5]}")
    return encoder
