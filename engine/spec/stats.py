"""Cumulative speculation counters of one engine, as the bench and the decode pod's /metrics read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpecStats:
    draft_tokens: int = 0
    """Proposed tokens verified by the target model."""
    accepted_tokens: int = 0
    """Proposed tokens the target model agreed with (kept as output)."""
    verify_steps: int = 0
    """Request-steps that verified at least one proposed token."""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify step: the accepted proposals plus the target's own next token."""
        return 1.0 + self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0

    def plus(self, draft_tokens: int, accepted_tokens: int, verify_steps: int) -> SpecStats:
        return SpecStats(
            self.draft_tokens + draft_tokens, self.accepted_tokens + accepted_tokens, self.verify_steps + verify_steps
        )
