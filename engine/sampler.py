"""Turns a batch of next-token logits into token ids, one row per request.

Order, as in vLLM and transformers: penalties on the raw logits; greedy rows take the argmax; sampled
rows divide by their temperature, apply top_k, top_p and min_p, and draw from the softmax. Each
sampled row's randomness is a function of its seed and the position of the token it samples only
(`position_seed`), not of a generator's hidden state: a seeded request yields the same tokens alone
or in any batch, and after its prompt KV moved to another pod, or its stream to another pair of pods
(the prompt then ends with the tokens already sampled, so the positions carry on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from common.sampling_params import SamplingParams

_MASK_64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """The generator seed of the draw for the token at `position` (0-based, in prompt + output) of a request seeded
    `seed`: splitmix64 of both, so that neighbouring seeds and positions give unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return (x ^ (x >> 31)) >> 1


# NOTE: float32 cumulative sums are off by ~1e-7; without this slack a top_p exactly equal to a
# prefix mass (six 0.1s vs 0.6) would keep one token too many on rounding noise alone.
_TOP_P_EPS = 1e-6


@dataclass(slots=True)
class SamplingBatch:
    """Per-row inputs of one sampling step; every list has one entry per row of logits."""

    params: list[SamplingParams]
    seeds: list[int | None]
    """The request's seed (its own, or one drawn once for it); None in greedy rows. A sampled row with None draws
    from torch's default generator."""
    positions: list[int]
    """Position (0-based, in prompt + output) of the token each row samples."""
    prompt_token_ids: list[Sequence[int]]
    output_token_ids: list[Sequence[int]]


@dataclass(slots=True, frozen=True)
class SamplerOutput:
    """Sampled ids [rows] int64 and, when some row asked for them, the raw-distribution log-prob of each row's token
    [rows] float32 (NaN in rows that did not ask); both stay on the logits' device until `to_lists`."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None

    def to_lists(self) -> tuple[list[int], list[float | None]]:
        """Host copies (a device sync); rows without log-probs get None."""
        token_ids = self.token_ids.tolist()
        if self.logprobs is None:
            return token_ids, [None] * len(token_ids)
        return token_ids, [None if math.isnan(v) else v for v in self.logprobs.tolist()]


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    repetition_penalties: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
) -> torch.Tensor:
    """Return penalized float32 logits [rows, vocab]; the penalty tensors are [rows] float32.

    Repetition penalty (transformers-style) over prompt and output tokens: positive logits are
    divided by it, negative ones multiplied. Then, over output tokens only (OpenAI-style):
    logit -= presence * (count > 0) + frequency * count.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    output_counts = _token_counts(output_token_ids, num_rows, vocab_size, device)
    prompt_counts = _token_counts(prompt_token_ids, num_rows, vocab_size, device)
    seen = (output_counts > 0) | (prompt_counts > 0)
    repetition = repetition_penalties.unsqueeze(1)
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts
    return logits - presence_penalties.unsqueeze(1) * (output_counts > 0).float()


def _token_counts(
    token_ids: Sequence[Sequence[int]], num_rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[rows, vocab] float32 occurrence counts of each token id in each row's list."""
    lengths = [len(ids) for ids in token_ids]
    # NOTE: np.fromiter is ~3x faster than torch.tensor on long Python int lists (1k-token prompts).
    flat_ids = np.fromiter(chain.from_iterable(token_ids), dtype=np.int64, count=sum(lengths))
    rows = torch.repeat_interleave(torch.arange(num_rows), torch.tensor(lengths, dtype=torch.int64))
    flat_index = (rows * vocab_size + torch.from_numpy(flat_ids)).to(device)
    counts = torch.zeros(num_rows * vocab_size, dtype=torch.float32, device=device)
    counts.index_add_(0, flat_index, torch.ones(flat_index.shape, dtype=torch.float32, device=device))
    return counts.view(num_rows, vocab_size)


def apply_top_k_top_p_min_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Return a copy of logits [rows, vocab] with the tokens each row's filters drop set to -inf.

    top_k [rows] int64 keeps the k most likely tokens (k >= vocab: off); then top_p [rows] keeps
    the smallest set whose probability mass reaches top_p (1.0: off); min_p [rows] drops tokens
    with probability < min_p * the top token's probability (0.0: off). The most likely token is
    always kept. Ties are broken by the sort order.
    """
    vocab_size = logits.shape[1]
    sorted_logits, sorted_ids = logits.sort(dim=1, descending=True)
    ranks = torch.arange(vocab_size, device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=1)
    mass_before = sorted_probs.cumsum(dim=1) - sorted_probs
    drop = (mass_before >= top_p.unsqueeze(1) - _TOP_P_EPS) & (top_p < 1.0).unsqueeze(1)
    # NOTE: min_p after top_k/top_p equals min_p before: renormalizing keeps p / p_max unchanged.
    drop |= sorted_probs < min_p.unsqueeze(1) * sorted_probs[:, :1]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)


class Sampler:
    """Stateless: picks one token per row of logits following that row's SamplingParams."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Never waits for the device: the output stays there."""
        params = batch.params
        if all(p.greedy and not p.logprobs and not p.has_penalty for p in params):
            # NOTE: the argmax of 16-bit logits equals that of their exact float32 upcast.
            return SamplerOutput(logits.argmax(dim=1), None)
        raw_logits = logits.float()
        penalized = self._penalize(raw_logits, batch)
        token_ids = torch.empty(len(params), dtype=torch.int64, device=logits.device)
        greedy_rows = [row for row, p in enumerate(params) if p.greedy]
        sampled_rows = [row for row, p in enumerate(params) if not p.greedy]
        if greedy_rows:
            token_ids[greedy_rows] = penalized[greedy_rows].argmax(dim=1)
        if sampled_rows:
            token_ids[sampled_rows] = self._sample(penalized[sampled_rows], batch, sampled_rows)
        return SamplerOutput(token_ids, self._logprobs(raw_logits, token_ids, batch))

    @staticmethod
    def _penalize(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        params = batch.params
        if not any(p.has_penalty for p in params):
            return logits

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=logits.device)

        # NOTE: only rows whose penalties read them pay for turning their token lists into tensors.
        prompt_ids = [
            ids if p.repetition_penalty != 1.0 else () for p, ids in zip(params, batch.prompt_token_ids, strict=True)
        ]
        output_ids = [ids if p.has_penalty else () for p, ids in zip(params, batch.output_token_ids, strict=True)]
        return apply_penalties(
            logits,
            prompt_ids,
            output_ids,
            column([p.repetition_penalty for p in params]),
            column([p.presence_penalty for p in params]),
            column([p.frequency_penalty for p in params]),
        )

    @staticmethod
    def _sample(logits: torch.Tensor, batch: SamplingBatch, rows: list[int]) -> torch.Tensor:
        """Sample one token per row of logits, which are the penalized logits of batch rows `rows`."""
        device = logits.device
        params = [batch.params[row] for row in rows]
        temperatures = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        logits = logits / temperatures.unsqueeze(1)
        if any(p.top_k != -1 or p.top_p < 1.0 or p.min_p > 0.0 for p in params):
            vocab_size = logits.shape[1]
            top_k = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
            logits = apply_top_k_top_p_min_p(
                logits,
                torch.tensor(top_k, dtype=torch.int64, device=device),
                torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
                torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            )
        probs = logits.softmax(dim=1)
        # NOTE: exponential race: argmax(p / q) with q ~ Exp(1) draws from p. Each row's q comes from a generator
        # seeded with (seed, position) only, which makes seeded requests independent of the batch and of where
        # they ran before. Seeding is host-side (the device reads the seed at launch): no sync.
        race = torch.empty_like(probs)
        generator = torch.Generator(device=device)
        for index, row in enumerate(rows):
            seed = batch.seeds[row]
            if seed is None:
                race[index].exponential_()
                continue
            generator.manual_seed(position_seed(seed, batch.positions[row]))
            race[index].exponential_(generator=generator)
        # NOTE: exponential_ may return exactly 0; the clamp keeps p / q finite and 0 for p == 0.
        race.clamp_(min=torch.finfo(torch.float32).tiny)
        return (probs / race).argmax(dim=1)

    @staticmethod
    def _logprobs(raw_logits: torch.Tensor, token_ids: torch.Tensor, batch: SamplingBatch) -> torch.Tensor | None:
        rows = [row for row, params in enumerate(batch.params) if params.logprobs]
        if not rows:
            return None
        logprobs = torch.full((len(batch.params),), float("nan"), dtype=torch.float32, device=raw_logits.device)
        row_logprobs = raw_logits[rows].log_softmax(dim=1)
        logprobs[rows] = row_logprobs.gather(1, token_ids[rows].unsqueeze(1)).squeeze(1)
        return logprobs
