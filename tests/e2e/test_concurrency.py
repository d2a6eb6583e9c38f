"""Acceptance 2: 64 concurrent streaming requests with mixed lengths all complete correctly (greedy, equal to
the offline engine) on 2 prefill and 2 decode pods. A burst of 4096 Tokenize calls at once on one channel is
answered in full (gRPC's own limit on calls the router has not taken up yet would cancel hundreds of them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2
from router.tokenizer.tokenizer_pool import load_tokenizer
from tests.e2e.support import Oracle, run_concurrently

NUM_REQUESTS = 64
NUM_BURST_CALLS = 4096
"""Above gRPC's default hard limit (3000) of calls held before the server takes them up."""
MAX_TOKENS = (1, 3, 6, 10)
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
    "bold",
    "zebras",
    "at",
    "dawn",
]


def make_prompts() -> list[str]:
    """Prompts of about 3 to 90 tokens, each different from its first word on."""
    return [
        f"Note {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range((i * 11) % 80))
        for i in range(NUM_REQUESTS)
    ]


def test_64_concurrent_streams_equal_the_offline_engine(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    prompts = make_prompts()
    max_tokens = [MAX_TOKENS[i % len(MAX_TOKENS)] for i in range(NUM_REQUESTS)]
    # NOTE: greedy decoding is deterministic, so each request's expected ids are a prefix of the longest run.
    longest = oracle.greedy(prompts, max(MAX_TOKENS))
    expected = [output.token_ids[:n] for output, n in zip(longest, max_tokens, strict=True)]

    requests = [{"prompt": p, "max_tokens": n, "temperature": 0.0} for p, n in zip(prompts, max_tokens, strict=True)]
    completions = run_concurrently(client, requests)
    assert [c.token_ids for c in completions] == expected
    assert [c.usage.completion_tokens for c in completions] == [len(ids) for ids in expected]
    assert [c.usage.prompt_tokens for c in completions] == [len(oracle.encode(p)) for p in prompts]
    assert all(c.finish_reason != sampling_pb2.FINISH_REASON_UNSPECIFIED for c in completions)
    assert all(c.finish_reason != sampling_pb2.FINISH_REASON_ABORT for c in completions)
    prefill_pods = {c.metrics.prefill_pod_id for c in completions}
    decode_pods = {c.metrics.decode_pod_id for c in completions if c.usage.completion_tokens > 1}
    assert len(prefill_pods) == 2 and len(decode_pods) == 2, (prefill_pods, decode_pods)


async def _tokenize_burst(address: str, texts: list[str]) -> list[list[int] | str]:
    """Every text's Tokenize answer (its token ids, or its status code's name), all called at once on one channel."""

    async def tokenize(stub: generation_pb2_grpc.GenerationServiceAsyncStub, text: str) -> list[int] | str:
        try:
            response = await stub.Tokenize(generation_pb2.TokenizeRequest(text=text), timeout=120)
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return list(response.token_ids)

    async with grpc.aio.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        return await asyncio.gather(*(tokenize(stub, text) for text in texts))


def test_a_burst_of_tokenize_calls_on_one_channel_is_answered_in_full(
    cluster: LocalCluster, smollm2_path: Path
) -> None:
    texts = [f"Burst call {i}: " + " ".join(WORDS[: i % len(WORDS)]) for i in range(NUM_BURST_CALLS)]
    tokenizer = load_tokenizer(smollm2_path)
    answers = asyncio.run(_tokenize_burst(cluster.router_address, texts))
    failures = [answer for answer in answers if isinstance(answer, str)]
    assert failures == []
    assert answers == [tokenizer.encode(text) for text in texts]
