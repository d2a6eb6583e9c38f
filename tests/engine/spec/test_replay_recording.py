"""Replaying the speculating engine's own output (engine.spec.replay.replay_until_reproduced): the round logic on a
scripted engine, and on a real engine whose first recording is wrong at one token (the divergence a bf16 argmax flip
causes, put there on purpose so that no CPU's rounding decides the outcome)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.replay import replay_until_reproduced
from engine.spec.stats import SpecStats
from tests.engine.model_factory import NEW_TOKENS, TINY_CONFIGS

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


TinyModel = tuple[Path, list[list[int]], list[list[int]]]

LEFT_AT = 14
"""The output position whose recorded token the test changes: the third verify step's last proposal (k = 4: the
first verify steps propose positions 1-4 and 6-9, the third 11-14)."""


@pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)
def test_the_engine_leaves_a_wrong_recording_and_follows_its_own_output(tiny_model: TinyModel) -> None:
    """The bf16 divergence replay_until_reproduced remedies, forced: the first recording differs from the greedy
    output at one position, as where a verify step's argmax flips in bf16 (module docstring of engine.spec.replay).
    Here in float32, with the flip put in the recording on purpose, so that the rounds and counts follow from the
    mechanism on any CPU: the engine leaves the recording there and gets no proposals after it; the second round
    replays what the engine output and follows it throughout."""
    path, prompts, expected = tiny_model
    prompts, expected = prompts[2:4], expected[2:4]
    wrong = [list(expected[0]), list(expected[1])]
    wrong[0][LEFT_AT] = (wrong[0][LEFT_AT] + 1) % TINY_CONFIGS["qwen3"].vocab_size
    engine = LLMEngine(engine_config(str(path), num_blocks=512, speculative_config={"method": "replay"}))
    recordings: list[list[list[int]]] = []

    def set_recordings(recorded: Mapping[tuple[int, ...], Sequence[int]]) -> None:
        recordings.append([list(recorded[tuple(p)]) for p in prompts])
        engine.set_replay_recordings(recorded)

    rounds: list[tuple[list[list[int]], SpecStats]] = []

    def decode() -> tuple[list[list[int]], SpecStats]:
        before = engine.spec_stats
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{len(rounds)}-{i}", prompt, params)
        tokens: dict[str, list[int]] = {f"{len(rounds)}-{i}": [] for i in range(len(prompts))}
        while engine.has_unfinished_requests():
            for output in engine.step():
                tokens[output.req_id] += output.new_token_ids
        after = engine.spec_stats
        stats = SpecStats(after.draft_tokens - before.draft_tokens, after.accepted_tokens - before.accepted_tokens)
        rounds.append((list(tokens.values()), stats))
        return rounds[-1]

    assert replay_until_reproduced(set_recordings, prompts, wrong, decode, max_rounds=4)[1:] == (2, True)
    assert recordings == [wrong, expected]
    # Round 1: both outputs are the greedy ones. The first request verifies 1-4 and 6-9 (8 accepted), then 11-14:
    # 3 accepted and the target's own token at 14, off the recording: no proposal after it (one-token steps). The
    # second follows its recording: 6 verify steps of 4 accepted + the target's own give 30 tokens after the
    # first; the 32nd is a one-token step (max_tokens leaves no room for a proposal).
    assert rounds[0] == (expected, SpecStats(12 + 24, 11 + 24))
    # Round 2: both follow their recording throughout.
    assert rounds[1] == (expected, SpecStats(24 + 24, 24 + 24))
