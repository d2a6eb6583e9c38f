"""The text decoder's tensors of a vision-language checkpoint, under the names a causal LM's checkpoint gives them
(`language_model.model.*` and `model.language_model.*` -> `model.*`, `language_model.lm_head.*` -> `lm_head.*`); the
image encoder's tensors are left to `engine.multimodal.image_encoder`. A text-only checkpoint passes unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from engine.multimodal.image_encoder import encoder_tensor_name

_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."), ("language_model.", ""))


def text_tensor_name(name: str) -> str:
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            return replacement + name.removeprefix(prefix)
    return name


def text_decoder_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in tensors:
        if encoder_tensor_name(name) is None:
            yield text_tensor_name(name), tensor
