"""best_of on the router: best_of sampled completions run as usual (with log-probs), and once all have finished
the n with the highest cumulative log-prob go out, best first, as completions 0..n-1 (one chunk each)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from common.sampling_params import SamplingParams
from router.outputs import CompletionChunk


@dataclass(slots=True)
class _Sample:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    last: CompletionChunk | None = None


def sample_params(params: SamplingParams) -> SamplingParams:
    """The params each of the best_of completions runs with: their log-probs rank them."""
    return dataclasses.replace(params, logprobs=True)


async def best_of(
    chunks: AsyncGenerator[CompletionChunk, None], params: SamplingParams
) -> AsyncGenerator[CompletionChunk, None]:
    """The n best of the best_of completions in `chunks`, once every one has finished."""
    samples = [_Sample() for _ in range(params.num_samples)]
    async for chunk in chunks:
        sample = samples[chunk.index]
        sample.text += chunk.text
        sample.token_ids.extend(chunk.token_ids)
        sample.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            sample.last = chunk
    ranked = sorted(samples, key=lambda s: -sum(s.logprobs))[: params.n]
    for index, sample in enumerate(ranked):
        assert sample.last is not None
        yield dataclasses.replace(
            sample.last,
            index=index,
            text=sample.text,
            token_ids=tuple(sample.token_ids),
            logprobs=tuple(sample.logprobs) if params.logprobs else (),
            cumulative_logprob=sum(sample.logprobs),
        )
