"""Acceptance 2: 64 concurrent streaming requests with mixed lengths all complete correctly (greedy, equal to
the offline engine) on 2 prefill and 2 decode pods."""

from __future__ import annotations

from cli.client import GenerationClient
from cli.cluster import LocalCluster
from pdserve.v1 import sampling_pb2
from tests.e2e.support import Oracle, run_concurrently

NUM_REQUESTS = 64
MAX_TOKENS = (1, 3, 6, 10)
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
    "while", "seven", "wizards", "quietly", "hex", "bold", "zebras", "at", "dawn",
]  # fmt: skip


def make_prompts() -> list[str]:
    """Prompts of about 3 to 90 tokens, each different from its first word on."""
    return [f"Note {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range((i * 11) % 80)) for i in
            range(NUM_REQUESTS)]  # fmt: skip


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
