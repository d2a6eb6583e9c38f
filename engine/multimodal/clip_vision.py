"""CLIP's vision transformer, up to the layer whose hidden states LLaVA projects.

Module names mirror the HF checkpoint (`vision_tower.embeddings.*`, `vision_tower.encoder.layers.N.*`), so weights
load by name. Only the layers up to the deepest feature layer are built: the rest (and `post_layernorm`) never
influence the image's embeddings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.multimodal.vlm_config import VisionTowerConfig


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, cfg: VisionTowerConfig) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.empty(cfg.hidden_size))
        self.patch_embedding = nn.Conv2d(
            cfg.num_channels, cfg.hidden_size, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=False
        )
        self.position_embedding = nn.Embedding(cfg.num_patches + 1, cfg.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, 1 + patches, hidden]: the CLS token, then the patches row by row."""
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class CLIPAttention(nn.Module):
    def __init__(self, cfg: VisionTowerConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class CLIPMLP(nn.Module):
    def __init__(self, cfg: VisionTowerConfig) -> None:
        super().__init__()
        self.act = activation(cfg.hidden_act)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, cfg: VisionTowerConfig) -> None:
        super().__init__()
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = CLIPMLP(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, cfg: VisionTowerConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(cfg) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """Runs `num_layers` encoder layers and returns the hidden states of `feature_layers` (HF's indexing:
    0 = the embeddings after `pre_layrnorm`, -1 = the last layer of the full tower)."""

    def __init__(self, cfg: VisionTowerConfig, feature_layers: tuple[int, ...]) -> None:
        super().__init__()
        self.indices = tuple(i if i >= 0 else cfg.num_layers + 1 + i for i in feature_layers)
        if not all(0 <= i <= cfg.num_layers for i in self.indices):
            raise ValueError(f"vision_feature_layer {feature_layers} outside the tower's {cfg.num_layers} layers")
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.encoder = CLIPEncoder(cfg, max(self.indices))

    def forward(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[B, C, H, W] -> the hidden states [B, 1 + patches, hidden] of each feature layer, in order."""
        x = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            states.append(x)
        return [states[i] for i in self.indices]
