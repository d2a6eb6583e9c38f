"""Per-request sampling parameters (vLLM-compatible names and meanings)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import InvalidArgumentError

GREEDY_TEMPERATURE = 1e-5
"""A temperature below this is greedy (as in vLLM): dividing logits by a tiny one overflows to inf."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(field_name, message)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 is greedy, and so is any temperature below GREEDY_TEMPERATURE (it becomes 0).
    top_k == -1 and top_p == 1 and min_p == 0 disable those filters.
    `seed` (an int64) makes a request's samples reproducible, whatever else is in its batch.
    `best_of` (default n): sample that many completions and return the n with the highest cumulative log-prob; with
    `use_beam_search` it is the beam width instead, and the n best beams come back, best first. Beam search is
    greedy (temperature 0), scored as transformers does: cumulative log-prob / generated length ** length_penalty;
    `early_stopping` True stops once best_of beams finished, False once no running beam can beat them (the
    transformers heuristic), "never" only when that is certain.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: bool = False
    priority: int = 0
    best_of: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        # NOTE: lists are accepted for convenience and frozen into tuples.
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _require(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        _require(0.0 <= self.temperature < math.inf, "temperature", f"must be finite and >= 0, got {self.temperature}")
        if self.temperature < GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        _require(self.top_k == -1 or self.top_k >= 1, "top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        _require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _require(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _require(
            0.0 < self.repetition_penalty < math.inf,
            "repetition_penalty",
            f"must be finite and > 0, got {self.repetition_penalty}",
        )
        _require(
            self.seed is None or _INT64_MIN <= self.seed <= _INT64_MAX,
            "seed",
            f"must be a signed 64-bit integer, got {self.seed}",
        )
        _require(
            -2.0 <= self.presence_penalty <= 2.0, "presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}"
        )
        _require(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        _require(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _require(all(s for s in self.stop), "stop", "stop strings must be non-empty")
        _require(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "token ids must be >= 0")
        self._check_best_of()

    def _check_best_of(self) -> None:
        _require(
            self.best_of is None or self.best_of >= self.n,
            "best_of",
            f"must be >= n ({self.n}), got {self.best_of}",
        )
        _require(math.isfinite(self.length_penalty), "length_penalty", f"must be finite, got {self.length_penalty}")
        _require(
            self.early_stopping in (True, False, "never"),
            "early_stopping",
            f"must be true, false or 'never', got {self.early_stopping!r}",
        )
        if not self.use_beam_search:
            return
        _require(self.temperature == 0.0, "temperature", f"must be 0 with beam search, got {self.temperature}")
        _require(not self.stop, "stop", "stop strings are not supported with beam search")
        _require(not self.has_penalty, "repetition_penalty", "penalties are not supported with beam search")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def num_samples(self) -> int:
        """Completions (or beams) the engine computes for the n it returns: best_of, else n."""
        return self.n if self.best_of is None else self.best_of

    @property
    def beam_width(self) -> int:
        """Beams of a beam search request (best_of, else n); 0 for a sampled one."""
        return self.num_samples if self.use_beam_search else 0

    @property
    def has_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def completion_seed(seed: int | None, index: int) -> int | None:
    """The seed of completion `index` of a request seeded `seed`: seed + index (as vLLM does), wrapped into int64
    so that a seed near 2**63 with n > 1 stays a valid seed."""
    if seed is None:
        return None
    return (seed + index - _INT64_MIN) % 2**64 + _INT64_MIN
