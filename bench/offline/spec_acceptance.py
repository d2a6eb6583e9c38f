"""Real acceptance of a proposer, computed exactly from a greedy output, and the batch-1 speedup it implies.

Greedy verification keeps the target's own tokens, so with speculation on a request emits exactly its greedy
output without it. Given that output, the verify steps are determined, and `count_acceptance` replays them:
1. the first output token comes from prefill (no proposal);
2. at each decode step, the proposer sees prompt + output so far and proposes up to k tokens, never more than the
   output still has after the step's own next token (`max_tokens` and EOS end the request there);
3. the step accepts the longest prefix of the proposal equal to the next greedy tokens, then adds the target's
   own next token: it advances by accepted + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.spec.proposer import Proposer
from engine.spec.stats import SpecStats

TASK_SEPARATOR = "%%%"
"""A line holding only this separates the prompts of a task file; the text before the first one describes it."""


@dataclass(frozen=True, slots=True)
class AcceptanceCounts:
    draft_tokens: int = 0  # proposed tokens, all verified
    accepted_tokens: int = 0  # proposed tokens equal to the greedy ones
    verify_steps: int = 0  # decode steps that verified at least one proposed token
    decode_steps: int = 0  # every step after prefill, with or without a proposal

    @property
    def acceptance_rate(self) -> float:
        return self._spec_stats().acceptance_rate

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify step (accepted + the target's own), as `SpecStats` defines it."""
        return self._spec_stats().mean_accepted_length

    def _spec_stats(self) -> SpecStats:
        """The engine's counters these counts stand for (SpecStats defines the derived figures once)."""
        return SpecStats(self.draft_tokens, self.accepted_tokens, self.verify_steps)

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per decode step, steps without a proposal included (1 token each)."""
        return 1.0 + self.accepted_tokens / self.decode_steps if self.decode_steps else 0.0

    def plus(self, other: AcceptanceCounts) -> AcceptanceCounts:
        return AcceptanceCounts(
            self.draft_tokens + other.draft_tokens,
            self.accepted_tokens + other.accepted_tokens,
            self.verify_steps + other.verify_steps,
            self.decode_steps + other.decode_steps,
        )

    def figures(self) -> dict[str, float]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "verify_steps": self.verify_steps,
            "decode_steps": self.decode_steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_step": self.tokens_per_step,
        }


def count_acceptance(
    prompt_ids: Sequence[int], output_ids: Sequence[int], proposer: Proposer, k: int
) -> AcceptanceCounts:
    """The verify steps of one greedy request (module docstring): what speculation with `proposer` and at most
    `k` proposed tokens per step would draft and accept while emitting `output_ids`."""
    token_ids = np.asarray([*prompt_ids, *output_ids], dtype=np.int64)
    outputs = token_ids[len(prompt_ids) :]
    draft = accepted = verify_steps = decode_steps = 0
    done = 1
    while done < len(outputs):
        num_proposed = min(k, len(outputs) - done - 1)
        proposal = proposer.propose(token_ids[: len(prompt_ids) + done], num_proposed) if num_proposed else None
        num_accepted = 0
        if proposal is not None and len(proposal):
            agree = proposal == outputs[done : done + len(proposal)]
            num_accepted = int(np.argmin(agree)) if not agree.all() else len(proposal)
            draft, accepted, verify_steps = draft + len(proposal), accepted + num_accepted, verify_steps + 1
        decode_steps += 1
        done += num_accepted + 1
    return AcceptanceCounts(draft, accepted, verify_steps, decode_steps)


IMPLIED_TPOT_FORMULA = "effective TPOT = verify-step time at k+1 tokens / tokens per decode step"


def implied_speedup(counts: AcceptanceCounts, decode_step_ms: float, verify_step_ms: float) -> dict[str, float]:
    """Batch-1 effective TPOT with speculation (IMPLIED_TPOT_FORMULA) and its speedup over plain decode steps.
    NOTE: every decode step is charged the verify-step time, steps without a proposal too (the verify graph runs
    padded), so the figure errs on the slow side."""
    effective_ms = verify_step_ms / counts.tokens_per_step
    return {"effective_tpot_ms": effective_ms, "speedup": decode_step_ms / effective_ms}


def load_task_set(path: Path) -> list[str]:
    """The prompts of one task file: the blocks between TASK_SEPARATOR lines, stripped; the first block (the
    file's description) is not a prompt."""
    blocks: list[list[str]] = [[]]
    for line in path.read_text().splitlines():
        if line.strip() == TASK_SEPARATOR:
            blocks.append([])
        else:
            blocks[-1].append(line)
    prompts = ["\n".join(block).strip() for block in blocks[1:]]
    if not prompts or not all(prompts):
        raise ValueError(f"{path}: expected prompts between lines holding only {TASK_SEPARATOR}, none empty")
    return prompts
