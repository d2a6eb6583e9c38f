"""The offline workloads of BENCHMARKS.md: random token-id prompts, fixed output lengths, EOS ignored."""

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
