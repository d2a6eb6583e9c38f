"""Replaying the speculating engine's own output (engine.spec.replay.replay_until_reproduced): the round logic on a
scripted engine, and the bf16 divergence it remedies on a random model on the CPU."""

from __future__ import annotations

import json
import random
from pathlib import Path

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.replay import replay_until_reproduced
from engine.spec.stats import SpecStats

OFF_TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
"""What a scripted engine outputs in one-token steps (as without speculation)."""
VERIFY_TOKENS = [1, 2, 3, 40, 5, 6, 7, 80, 9, 10]
"""What it outputs where a verify step computes the token instead: two argmax flips."""


def scripted_decode(recording: list[int]) -> list[int]:
    """A verify step's token while the output follows the recording, a one-token step's once it left it."""
    output: list[int] = []
    for position in range(len(OFF_TOKENS)):
        following = output == recording[:position]
        output.append((VERIFY_TOKENS if following else OFF_TOKENS)[position])
    return output


def test_rounds_until_the_output_is_its_recording() -> None:
    recordings: list[list[int]] = []

    def decode() -> tuple[list[list[int]], int]:
        return [scripted_decode(recordings[-1])], len(recordings)

    def set_recordings(recorded: dict[tuple[int, ...], list[int]]) -> None:
        recordings.append(recorded[(0,)])

    # Round 1 leaves the recording at 40, round 2 at 80, round 3 follows it throughout.
    assert replay_until_reproduced(set_recordings, [[0]], [OFF_TOKENS], decode, max_rounds=5) == (3, 3, True)
    assert recordings == [OFF_TOKENS, [1, 2, 3, 40, 5, 6, 7, 8, 9, 10], VERIFY_TOKENS]
    recordings.clear()
    assert replay_until_reproduced(set_recordings, [[0]], [OFF_TOKENS], decode, max_rounds=2) == (2, 2, False)


def wide_bf16_model(folder: Path) -> Path:
    """A random Qwen3 with a 32k vocabulary: its greedy argmax is a near tie every few dozen tokens in bf16."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 32768,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 1024,
        "torch_dtype": "bfloat16",
        "eos_token_id": 0,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def decode_greedy(engine: LLMEngine, prompt: list[int], max_tokens: int) -> list[int]:
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    return tokens


def test_bf16_output_leaves_the_recording_without_speculation_and_follows_its_own(tmp_path: Path) -> None:
    path = wide_bf16_model(tmp_path)
    args = {"dtype": "bfloat16", "load_format": "dummy", "num_blocks": 64}
    rng = random.Random(29)
    prompt = [rng.randrange(32768) for _ in range(64)]
    off = decode_greedy(LLMEngine(engine_config(str(path), **args)), prompt, 32)
    engine = LLMEngine(engine_config(str(path), speculative_config={"method": "replay"}, **args))

    def decode() -> tuple[list[list[int]], SpecStats]:
        before = engine.spec_stats
        tokens = decode_greedy(engine, prompt, 32)
        after = engine.spec_stats
        return [tokens], SpecStats(
            after.draft_tokens - before.draft_tokens, after.accepted_tokens - before.accepted_tokens
        )

    stats, rounds, reproduced = replay_until_reproduced(engine.set_replay_recordings, [prompt], [off], decode, 4)
    # NOTE: on x86 (oneDNN bf16 GEMMs) the recording without speculation holds for 14 tokens: a verify step flips
    # the 15th. The second round replays the first's output and follows it to the end.
    assert (rounds, reproduced) == (2, True)
    # 31 tokens after the first: 6 verify steps of 4 accepted + the target's own, then one one-token step.
    assert (stats.draft_tokens, stats.accepted_tokens) == (24, 24)
