"""A chat prompt's images on the router: checked (count against --limit-mm-per-prompt, bytes, the header's format
and size; the prefill pod decodes them) and placed: each image token the chat template wrote becomes the model's
run of placeholders, with the image at its offset (`common.multimodal.expand_image_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

from common.errors import InvalidArgumentError
from common.image_probe import probe_image
from common.multimodal import ImageInput, expand_image_tokens
from router.config import RouterConfig
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import ChatMessage


class PromptImages:
    def __init__(self, model: ModelInfo, limits: RouterConfig) -> None:
        self._model = model
        self._max_images = limits.max_images_per_prompt
        self._max_bytes = limits.max_image_bytes
        self._max_pixels = limits.max_image_pixels

    def check(self, messages: Sequence[ChatMessage]) -> list[bytes]:
        """The messages' images in order, each checked; InvalidArgumentError naming `messages` otherwise."""
        images = [image for message in messages for image in message.images]
        if not images:
            return images
        if self._model.image_token_id is None:
            raise InvalidArgumentError("messages", f"model {self._model.model_id} takes no images")
        if len(images) > self._max_images:
            raise InvalidArgumentError(
                "messages",
                f"{len(images)} images; at most {self._max_images} per prompt (--limit-mm-per-prompt "
                f"image={self._max_images})",
            )
        for i, data in enumerate(images):
            if len(data) > self._max_bytes:
                raise InvalidArgumentError("messages", f"image {i}: {len(data)} bytes, over {self._max_bytes}")
            probe_image(data, "messages", self._max_pixels)
        return images

    def place(self, token_ids: list[int], images: list[bytes]) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt with each image token expanded to the model's placeholders, and the images at them."""
        if not images:
            return token_ids, ()
        assert self._model.image_token_id is not None
        try:
            expanded, placed = expand_image_tokens(
                token_ids, self._model.image_token_id, self._model.num_image_tokens, images
            )
        except ValueError as exc:
            raise InvalidArgumentError("messages", f"the chat template did not place every image: {exc}") from None
        return expanded, tuple(placed)
