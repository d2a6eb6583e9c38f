"""best_of on the router (the n samples with the highest cumulative log-prob, re-indexed) and the wire form of the
beam search fields."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from common.errors import InvalidArgumentError
from common.proto_convert import sampling_params_from_pb, sampling_params_to_pb
from common.sampling_params import SamplingParams
from pdserve.v1 import sampling_pb2
from router.completion.best_of import best_of
from router.outputs import CompletionChunk


async def _chunks() -> AsyncGenerator[CompletionChunk, None]:
    yield CompletionChunk(0, "a", (1,), (-0.5,))
    yield CompletionChunk(1, "x", (7,), (-0.1,))
    yield CompletionChunk(2, "p", (4,), (-2.0,), "length")
    yield CompletionChunk(0, "b", (2,), (-0.5,), "length")
    yield CompletionChunk(1, "y", (8,), (-0.3,), "stop", 8)


def test_best_of_returns_the_most_likely_samples_reindexed() -> None:
    async def collect() -> list[CompletionChunk]:
        params = SamplingParams(n=2, best_of=3, logprobs=False)
        return [chunk async for chunk in best_of(_chunks(), params)]

    first, second = asyncio.run(collect())
    assert (first.index, first.text, first.token_ids, first.logprobs) == (0, "xy", (7, 8), ())
    assert (first.finish_reason, first.stop_reason) == ("stop", 8)
    assert first.cumulative_logprob == pytest.approx(-0.4)
    assert (second.index, second.text, second.token_ids, second.cumulative_logprob) == (1, "ab", (1, 2), -1.0)


def test_beam_fields_round_trip_and_bad_early_stopping_is_named() -> None:
    params = SamplingParams(n=2, best_of=4, temperature=0.0, use_beam_search=True, length_penalty=0.5)
    for early_stopping in (True, False, "never"):
        beam = SamplingParams(**{**_fields(params), "early_stopping": early_stopping})
        assert sampling_params_from_pb(sampling_params_to_pb(beam), max_n=1) == beam
    with pytest.raises(InvalidArgumentError) as err:
        sampling_params_from_pb(sampling_pb2.SamplingParams(early_stopping="soon"))
    assert err.value.field == "sampling_params.early_stopping"
    with pytest.raises(InvalidArgumentError) as too_many:
        sampling_params_from_pb(sampling_pb2.SamplingParams(n=2), max_n=1)
    assert too_many.value.field == "n"


def _fields(params: SamplingParams) -> dict[str, object]:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}
