"""Speculative decoding configuration, with vLLM's field names.

`SpeculativeConfig.parse` takes what a user writes: a dict (`LLM(..., speculative_config={...})`), a JSON string
(the pods' `--speculative-config` flag or `PDSERVE_SPECULATIVE_CONFIG`), or None (speculation off). Every error
names its field as `speculative_config.<field>`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.config import doc
from common.errors import InvalidArgumentError

DRAFT_METHODS = ("draft_model", "draft_replay")
"""Methods that run a draft model (engine.spec.draft_model)."""
METHODS = ("ngram", "replay", *DRAFT_METHODS)
_PREFIX = "speculative_config"


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidArgumentError(f"{_PREFIX}.{field_name}", message)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str = field(
        default="ngram",
        metadata=doc(
            "ngram (prompt lookup); draft_model (a small model of the same tokenizer, `model`); replay, or "
            "draft_replay (the draft model's cost with replay's proposals): benchmarks and tests, see "
            "engine.spec.replay"
        ),
    )
    num_speculative_tokens: int = field(default=4, metadata=doc("most tokens proposed per request per step (k)"))
    prompt_lookup_max: int = field(default=4, metadata=doc("ngram: longest suffix n-gram looked up"))
    prompt_lookup_min: int = field(default=1, metadata=doc("ngram: shortest suffix n-gram looked up"))
    replay_corruption: float = field(
        default=0.0, metadata=doc("replay: fraction of proposed tokens replaced by a wrong token")
    )
    disable_by_batch_size: int = field(
        default=32, metadata=doc("no proposals for any request while this many or more requests run")
    )
    min_acceptance: float = field(
        default=0.25,
        metadata=doc("a request whose acceptance rate (moving average) falls below this stops proposing"),
    )
    probe_interval: int = field(
        default=16, metadata=doc("a request that stopped proposing tries again after this many steps")
    )
    model: str = field(
        default="",
        metadata=doc("draft_model, draft_replay: the draft model, a folder or alias resolved as --model is"),
    )

    def __post_init__(self) -> None:
        _require(self.method in METHODS, "method", f"must be one of {METHODS}, got {self.method!r}")
        _require(
            bool(self.model) == (self.method in DRAFT_METHODS),
            "model",
            f"names the draft model of the methods {DRAFT_METHODS} and only theirs (method {self.method!r}, "
            f"model {self.model!r})",
        )
        _require(
            self.num_speculative_tokens > 0,
            "num_speculative_tokens",
            f"must be > 0, got {self.num_speculative_tokens}",
        )
        _require(self.prompt_lookup_min > 0, "prompt_lookup_min", f"must be > 0, got {self.prompt_lookup_min}")
        _require(
            self.prompt_lookup_max >= self.prompt_lookup_min,
            "prompt_lookup_max",
            f"must be >= prompt_lookup_min ({self.prompt_lookup_min}), got {self.prompt_lookup_max}",
        )
        _require(
            0.0 <= self.replay_corruption <= 1.0,
            "replay_corruption",
            f"must be in [0, 1], got {self.replay_corruption}",
        )
        _require(
            self.disable_by_batch_size > 0,
            "disable_by_batch_size",
            f"must be > 0, got {self.disable_by_batch_size}",
        )
        _require(0.0 <= self.min_acceptance <= 1.0, "min_acceptance", f"must be in [0, 1], got {self.min_acceptance}")
        _require(self.probe_interval > 0, "probe_interval", f"must be > 0, got {self.probe_interval}")

    @classmethod
    def parse(cls, value: SpeculativeConfig | Mapping[str, Any] | str | None) -> SpeculativeConfig | None:
        """The config of a dict, a JSON object string or an instance; None or "" is None (off)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidArgumentError(_PREFIX, f"not valid JSON: {exc}") from None
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(_PREFIX, f"must be a JSON object, got {type(value).__name__}")
        return cls._from_mapping(value)

    @classmethod
    def _from_mapping(cls, values: Mapping[str, Any]) -> SpeculativeConfig:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, item in values.items():
            _require(key in fields, str(key), f"unknown field (known: {', '.join(fields)})")
            expected = type(fields[key].default)
            ok = isinstance(item, expected) and not (expected is int and isinstance(item, bool))
            if expected is float and isinstance(item, int) and not isinstance(item, bool):
                ok = True
            _require(ok, key, f"must be a {expected.__name__}, got {item!r}")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SpeculativeFlags:
    """The CLI flag / environment variable that carries a SpeculativeConfig as JSON."""

    speculative_config: str | None = field(
        default=None,
        metadata=doc(
            'speculative decoding as JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4, '
            '"prompt_lookup_max": 4, "prompt_lookup_min": 1} or {"method": "draft_model", "model": "FOLDER", '
            '"num_speculative_tokens": 4}; unset: off'
        ),
    )

    def __post_init__(self) -> None:
        try:
            SpeculativeConfig.parse(self.speculative_config)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError("speculative_config", str(exc)) from None

    def to_config(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.parse(self.speculative_config)
