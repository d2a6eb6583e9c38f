"""An image of a request, ready for the encoder: where its placeholders sit, its hash, its pixel values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(slots=True, frozen=True)
class ImageFeature:
    """Placeholders `prompt_token_ids[offset : offset + num_tokens]` take the embeddings the encoder computes from
    `pixel_values` [C, H, W]; `hash_token_id` stands for them in block hashes (`common.multimodal`)."""

    offset: int
    num_tokens: int
    image_hash: bytes
    hash_token_id: int
    pixel_values: torch.Tensor

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


def overlapping(features: Sequence[ImageFeature], start: int, end: int) -> tuple[ImageFeature, ...]:
    """The features with placeholders among positions [start, end)."""
    return tuple(f for f in features if f.offset < end and start < f.end)
