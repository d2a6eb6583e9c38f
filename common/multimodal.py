"""Images in a prompt, as every layer sees them: the encoded bytes, where their placeholder tokens sit, and their hash.

A vision-language prompt holds, for each image, a run of placeholder tokens (the model's image token) whose
embeddings the vision encoder computes. Those placeholder ids are the same for every image, so the prefix cache keys
them by the image instead: for hashing (router, prefill pool, directory alike) each placeholder id stands replaced by
an id derived from the image's hash (`block_token_ids`), as vLLM's mm_hashes do. The derived ids are negative: they
never equal a real token id, so a block holding an image never matches a block of text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_DIGEST_SIZE = 16


def hash_image(data: bytes) -> bytes:
    """The image's stable hash (BLAKE2b over its encoded bytes)."""
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE, person=b"pdserve-image").digest()


@dataclass(slots=True, frozen=True)
class ImageInput:
    """One image of a prompt: its encoded bytes (PNG or JPEG), its placeholder tokens
    `prompt_token_ids[offset : offset + num_tokens]`, and `hash_image(data)`."""

    data: bytes
    offset: int
    num_tokens: int
    image_hash: bytes

    @classmethod
    def of(cls, data: bytes, offset: int, num_tokens: int) -> ImageInput:
        return cls(data, offset, num_tokens, hash_image(data))

    @property
    def hash_token_id(self) -> int:
        """The id its placeholders stand replaced by for hashing: negative, in int64 range."""
        return -1 - (int.from_bytes(self.image_hash[:8], "little") >> 1)


class ImageSpan(Protocol):
    """An image's placeholders in a prompt, and the id that stands for them in block hashes."""

    @property
    def offset(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def hash_token_id(self) -> int: ...


def block_token_ids(token_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[int]:
    """`token_ids` with every image's placeholder positions replaced by its `hash_token_id` (what block hashes and
    the cache's block checks cover)."""
    ids = list(token_ids)
    for image in images:
        ids[image.offset : image.offset + image.num_tokens] = [image.hash_token_id] * image.num_tokens
    return ids


def expand_image_tokens(
    token_ids: Sequence[int], image_token_id: int, num_image_tokens: int, images: Sequence[bytes]
) -> tuple[list[int], list[ImageInput]]:
    """A rendered prompt with one `image_token_id` per image -> the prompt with each expanded to the model's
    `num_image_tokens` placeholders, and the images placed at them in order. Raises ValueError when the number of
    image tokens differs from the number of images."""
    found = [i for i, token_id in enumerate(token_ids) if token_id == image_token_id]
    if len(found) != len(images):
        raise ValueError(f"the prompt holds {len(found)} image tokens for {len(images)} images")
    expanded: list[int] = []
    placed: list[ImageInput] = []
    start = 0
    for position, data in zip(found, images, strict=True):
        expanded.extend(token_ids[start:position])
        placed.append(ImageInput.of(data, len(expanded), num_image_tokens))
        expanded.extend([image_token_id] * num_image_tokens)
        start = position + 1
    expanded.extend(token_ids[start:])
    return expanded, placed
