"""Acceptance 4: the first token streams before the decode pod produced its first token, and the KV moved
prefill -> decode is exactly the prompt's blocks."""

from __future__ import annotations

import json

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from engine.model_store import resolve_model
from tests.e2e.support import BLOCK_SIZE, Oracle, num_blocks, run

PROMPT = "Write a short story about a robot who learns to paint. " * 4


def block_nbytes() -> int:
    """Bytes of one KV block of the default model on CPU (float32): layers x (K, V) x block x kv heads x head dim."""
    config = json.loads((resolve_model("smollm2-135m") / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * BLOCK_SIZE * config["num_key_value_heads"] * head_dim * 4


def test_first_token_streams_before_the_decode_pods_first_token(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    completion = run(client, prompt=PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)
    [expected] = oracle.greedy([PROMPT], 8)
    assert completion.token_ids == expected.token_ids
    metrics = completion.metrics
    assert metrics.time_to_first_token.ToNanoseconds() > 0
    assert metrics.time_to_first_token.ToNanoseconds() < metrics.time_to_first_decode_token.ToNanoseconds()
    assert completion.first_token_ids == expected.token_ids[:1]
    assert completion.num_messages >= 2
    assert completion.message_times == sorted(completion.message_times)
    assert metrics.prefill_pod_id.startswith("prefill-") and metrics.decode_pod_id.startswith("decode-")


def test_kv_transfer_moves_exactly_the_prompts_blocks(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    completion = run(client, prompt=PROMPT, max_tokens=3, temperature=0.0, ignore_eos=True)
    num_prompt_tokens = len(oracle.encode(PROMPT))
    assert completion.usage.prompt_tokens == num_prompt_tokens
    assert completion.metrics.kv_transfer_bytes == num_blocks(num_prompt_tokens) * block_nbytes()


def test_a_one_token_request_has_no_decode_phase(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    completion = run(client, prompt="The capital of France is", max_tokens=1, temperature=0.0)
    assert completion.token_ids == oracle.greedy(["The capital of France is"], 1)[0].token_ids
    assert completion.usage.completion_tokens == 1
    assert completion.metrics.time_to_first_token.ToNanoseconds() > 0
    assert not completion.metrics.HasField("time_to_first_decode_token")
