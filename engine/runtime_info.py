"""Facts measured when an engine starts (never written back into config)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    model_id: str
    device: str
    dtype: str
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise InvalidArgumentError naming the field for input this engine cannot serve."""
        if not prompt_token_ids:
            raise InvalidArgumentError("prompt", "must not be empty")
        vocab = self.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgumentError("prompt_token_ids", f"token id {bad} outside the vocabulary [0, {vocab})")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidArgumentError(
                "max_tokens",
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{total} exceeds max_model_len {self.max_model_len}",
            )
