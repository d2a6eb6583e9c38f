"""What the router knows of the served model, read from its config files (no torch, no weights)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.models.arch_config import ArchConfig
from engine.multimodal.vlm_config import VisionLanguageConfig


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """The served model's limits, as Generate validates them and GetModelInfo reports them."""

    model_id: str
    """The --model string as given: the prefix-cache key that pods must share."""
    max_model_len: int
    vocab_size: int
    block_size: int
    eos_token_ids: tuple[int, ...]
    image_token_id: int | None = None
    """A vision-language model's image placeholder token (None: the model takes no images)."""
    num_image_tokens: int = 0
    """Placeholders each image expands to."""

    @classmethod
    def from_folder(cls, model_id: str, folder: Path, block_size: int) -> ModelInfo:
        """Read `config.json` (+ `generation_config.json` for extra EOS ids) the way the engine does.

        NOTE: a pod may serve a shorter max_model_len (its --max-model-len, or a KV pool smaller than
        one sequence); the pod's own validation reports that case.
        """
        arch = ArchConfig.from_folder(folder)
        vision = VisionLanguageConfig.from_folder(folder)
        max_model_len = arch.max_position_embeddings
        if arch.sliding_window is not None:
            max_model_len = min(max_model_len, arch.sliding_window)
        return cls(
            model_id=model_id,
            max_model_len=max_model_len,
            vocab_size=arch.vocab_size,
            block_size=block_size,
            eos_token_ids=_eos_token_ids(folder, arch.eos_token_ids),
            image_token_id=None if vision is None else vision.image_token_id,
            num_image_tokens=0 if vision is None else vision.num_image_tokens,
        )


def _eos_token_ids(folder: Path, from_config: tuple[int, ...]) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
    extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys([*from_config, *extra]))
