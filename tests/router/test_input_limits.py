"""Sampling values at the edges of their ranges reach the pods as defined values: a seed near 2**63 with n > 1
wraps within int64, and a tiny positive temperature is greedy (as in vLLM)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from pdserve.v1 import generation_pb2, sampling_pb2
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import FakeDecode, FakePrefill, decode_steps, router_over

pytestmark = pytest.mark.anyio

INT64_MAX = 2**63 - 1


async def _generate(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, **params: object
) -> FakePrefill:
    prefill = FakePrefill(first_token_id=5)
    decode = FakeDecode("decode-0", decode_steps([6]))
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(token_ids=list(range(1000, 1020))),
        sampling_params=sampling_pb2.SamplingParams(max_tokens=2, **params),  # type: ignore[arg-type]
    )
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        responses = [response async for response in router.stub.Generate(request)]
    assert sum(len(r.token_ids) for r in responses) == 2 * max(int(params.get("n", 1)), 1)  # type: ignore[call-overload]
    return prefill


async def test_a_seed_near_int64_max_with_n_wraps_within_int64(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = await _generate(tokenizer_pool, tokenizer, model, n=3, seed=INT64_MAX - 1)
    assert sorted(r.sampling_params.seed for r in prefill.requests) == [-(2**63), INT64_MAX - 1, INT64_MAX]


@pytest.mark.parametrize(("temperature", "sent"), [(1e-300, 0.0), (9.9e-6, 0.0), (1e-5, 1e-5)])
async def test_a_tiny_temperature_is_greedy(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo, temperature: float, sent: float
) -> None:
    prefill = await _generate(tokenizer_pool, tokenizer, model, temperature=temperature)
    assert [r.sampling_params.temperature for r in prefill.requests] == [sent]
