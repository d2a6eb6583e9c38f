"""The model runner's image hook: a step that computes image placeholders runs on input embeddings, the token
embeddings with each placeholder's row replaced by its image's embedding from the encoder.

Images are encoded when a step first computes one of their placeholders; chunked prefill may split an image over
steps, so the embeddings of the last few images stay cached (by image hash) until they are pushed out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from common.errors import InvalidArgumentError
from engine.models.loader import safetensors_files
from engine.multimodal.features import ImageFeature
from engine.multimodal.image_encoder import LlavaImageEncoder, load_image_encoder
from engine.multimodal.vlm_config import VisionLanguageConfig
from engine.scheduler_output import ScheduledRequest

ENCODER_CACHE_IMAGES = 8


class PromptEmbedder:
    def __init__(self, encoder: LlavaImageEncoder, embed_tokens: nn.Module) -> None:
        self.encoder = encoder
        self.embed_tokens = embed_tokens
        self._cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    @classmethod
    def for_model(
        cls, folder: Path, embed_tokens: nn.Module | None, dtype: torch.dtype, device: torch.device, world_size: int
    ) -> PromptEmbedder | None:
        """The hook of a vision-language checkpoint (None for a text-only one)."""
        cfg = VisionLanguageConfig.from_folder(folder)
        if cfg is None:
            return None
        if world_size > 1 or embed_tokens is None:
            raise InvalidArgumentError("tensor_parallel_size", f"{folder.name}: image inputs run on one device only")
        return cls(load_image_encoder(folder, safetensors_files(folder), cfg, dtype, device), embed_tokens)

    @staticmethod
    def has_images(scheduled: Sequence[ScheduledRequest]) -> bool:
        return any(r.mm_features for r in scheduled)

    def embeddings(
        self, scheduled: Sequence[ScheduledRequest], input_ids: torch.Tensor, query_start_loc: Sequence[int]
    ) -> torch.Tensor:
        """[T, hidden] input embeddings of the step (the eager layout: request i's rows from query_start_loc[i])."""
        embeds: torch.Tensor = self.embed_tokens(input_ids)
        self._encode_missing([f for r in scheduled for f in r.mm_features])
        for req, row in zip(scheduled, query_start_loc, strict=False):
            start = req.num_computed_tokens
            end = start + len(req.token_ids)
            for feature in req.mm_features:
                lo, hi = max(start, feature.offset), min(end, feature.end)
                image = self._cache[feature.image_hash]
                embeds[row + lo - start : row + hi - start] = image[lo - feature.offset : hi - feature.offset]
        return embeds

    @torch.no_grad()
    def _encode_missing(self, features: list[ImageFeature]) -> None:
        """Encode the images not cached yet (in one batch), then keep the most recent ones."""
        missing = {f.image_hash: f for f in features if f.image_hash not in self._cache}
        if missing:
            device = self.encoder.multi_modal_projector.linear_1.weight.device
            pixels = torch.stack([f.pixel_values for f in missing.values()]).to(device, non_blocking=True)
            for image_hash, image in zip(missing, self.encoder(pixels), strict=True):
                self._cache[image_hash] = image
        for feature in features:
            self._cache.move_to_end(feature.image_hash)
        keep = max(ENCODER_CACHE_IMAGES, len(features))
        while len(self._cache) > keep:
            self._cache.popitem(last=False)
