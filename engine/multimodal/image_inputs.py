"""The engine's admission of a prompt's images: checks their placement against the prompt and preprocesses them
into `ImageFeature`s (on a prefill pod, in its engine core: the vision encoder's host)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.errors import InvalidArgumentError
from common.multimodal import ImageInput
from engine.multimodal.features import ImageFeature
from engine.multimodal.vlm_config import VisionLanguageConfig


class ImageInputs:
    def __init__(self, config: VisionLanguageConfig) -> None:
        # NOTE: imported here (it imports Pillow): an engine serving a text-only model never loads it.
        from engine.multimodal.image_processor import ImageProcessor

        self.config = config
        self.processor = ImageProcessor(config.processor)

    @classmethod
    def from_folder(cls, folder: Path) -> ImageInputs | None:
        cfg = VisionLanguageConfig.from_folder(folder)
        return None if cfg is None else cls(cfg)

    def features(self, prompt_token_ids: Sequence[int], images: Sequence[ImageInput]) -> tuple[ImageFeature, ...]:
        """Each image preprocessed, once its placeholders are checked: `num_image_tokens` image tokens inside the
        prompt, in order, none shared."""
        cfg = self.config
        features = []
        previous_end = 0
        for i, image in enumerate(images):
            field = f"images[{i}]"
            end = image.offset + image.num_tokens
            if image.num_tokens != cfg.num_image_tokens:
                raise InvalidArgumentError(field, f"takes {cfg.num_image_tokens} tokens, not {image.num_tokens}")
            if image.offset < previous_end or end > len(prompt_token_ids):
                raise InvalidArgumentError(field, f"placeholders [{image.offset}, {end}) overlap or pass the prompt")
            if any(t != cfg.image_token_id for t in prompt_token_ids[image.offset : end]):
                raise InvalidArgumentError(field, f"placeholders must all be the image token {cfg.image_token_id}")
            pixels = self.processor.pixel_values(image.data, field)
            features.append(ImageFeature(image.offset, image.num_tokens, image.image_hash, image.hash_token_id, pixels))
            previous_end = end
        return tuple(features)
