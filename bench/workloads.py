"""The offline workloads of docs/workloads.md: random token-id prompts, fixed output lengths, EOS ignored."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: list[RequestSpec]
    sequential: bool  # one request at a time (latency) vs all submitted at once (throughput)


def _prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


def make_workload(
    name: str, vocab_size: int, num_prompts: int, input_len: int | None, output_len: int | None, seed: int = 0
) -> Workload:
    """W1 decode-bs1, W2 ttft, W3 nano, W4 grid (one cell, chosen with input/output lengths)."""
    rng = random.Random(seed)
    if name == "w1":
        n_in, n_out = input_len or 128, output_len or 512
        return Workload(
            f"w1 decode-bs1 {n_in}/{n_out}",
            [RequestSpec(_prompt(rng, n_in, vocab_size), n_out) for _ in range(num_prompts)],
            True,
        )
    if name == "w2":
        n_in = input_len or 2048
        return Workload(
            f"w2 ttft {n_in}/1", [RequestSpec(_prompt(rng, n_in, vocab_size), 1) for _ in range(num_prompts)], True
        )
    if name == "w3":
        specs = [
            RequestSpec(_prompt(rng, rng.randint(100, 1024), vocab_size), rng.randint(100, 1024))
            for _ in range(num_prompts)
        ]
        return Workload(f"w3 nano {num_prompts} seqs U[100,1024]/U[100,1024]", specs, False)
    if name == "w4":
        n_in, n_out = input_len or 128, output_len or 128
        return Workload(
            f"w4 grid {n_in}/{n_out} x{num_prompts}",
            [RequestSpec(_prompt(rng, n_in, vocab_size), n_out) for _ in range(num_prompts)],
            False,
        )
    raise ValueError(f"unknown offline workload {name!r}; choose w1, w2, w3 or w4")


def fixed_requests(
    vocab_size: int, num_requests: int, input_len: int, output_len: int, seed: int | str
) -> list[RequestSpec]:
    """`num_requests` random prompts of `input_len` tokens, each asking for `output_len` tokens (W2, W7, W8)."""
    rng = random.Random(seed)
    return [RequestSpec(_prompt(rng, input_len, vocab_size), output_len) for _ in range(num_requests)]


def mixed_requests(
    vocab_size: int, num_requests: int, mean_input_len: int, mean_output_len: int, seed: int | str
) -> list[RequestSpec]:
    """W5: prompt and output lengths drawn uniformly from [mean / 2, 3 * mean / 2] (means ~200 / ~180)."""
    rng = random.Random(seed)
    return [
        RequestSpec(
            _prompt(rng, rng.randint(mean_input_len // 2, mean_input_len * 3 // 2), vocab_size),
            max(1, rng.randint(mean_output_len // 2, mean_output_len * 3 // 2)),
        )
        for _ in range(num_requests)
    ]


def shared_prefix_requests(
    vocab_size: int, num_requests: int, prefix_len: int, suffix_len: int, output_len: int, seed: int | str
) -> list[RequestSpec]:
    """W9: one random `prefix_len`-token system prompt, each request adding `suffix_len` tokens of its own."""
    rng = random.Random(seed)
    prefix = _prompt(rng, prefix_len, vocab_size)
    return [RequestSpec(prefix + _prompt(rng, suffix_len, vocab_size), output_len) for _ in range(num_requests)]
