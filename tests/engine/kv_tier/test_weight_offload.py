"""cpu_offload_gb: which layers are offloaded, that each is copied in before it runs, and exact greedy output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.kv_tier.weight_offload import layers_to_offload
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.quant_support import greedy

GIB = 2**30


@pytest.mark.parametrize(
    ("gib", "expected"),
    [
        (0.0, []),
        (0.5, [2, 3]),  # the staging set keeps one layer on the device: two layers save one
        (1.0, [2, 3]),
        (1.5, [1, 2, 3]),
        (3.0, [0, 1, 2, 3]),
        (9.0, [0, 1, 2, 3]),  # more than the model: every layer
    ],
)
def test_the_last_layers_that_save_the_budget_are_picked(gib: float, expected: list[int]) -> None:
    assert layers_to_offload([GIB] * 4, gib) == expected


def test_offloaded_model_copies_each_layer_in_and_matches(tiny_qwen3_path: Path) -> None:
    path = tiny_qwen3_path
    rng = random.Random(7)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 40)]
    expected = greedy(LLMEngine(engine_config(str(path), num_blocks=32)), prompts, 8)
    # One tiny layer is ~0.15 MiB: 0.1 MiB saved needs two layers (the model's both), sharing one staging set.
    engine = LLMEngine(engine_config(str(path), num_blocks=32, cpu_offload_gb=0.1 / 1024))
    offloaded = engine.runner.offloaded_layers
    assert len(offloaded) == 2
    layers = engine.runner.model.model.layers
    assert all(
        p0.data_ptr() == p1.data_ptr() for p0, p1 in zip(layers[0].parameters(), layers[1].parameters(), strict=True)
    )
    assert greedy(engine, prompts, 8) == expected
    # Each step runs both layers once: 1 prefill step of both prompts, then 7 decode steps.
    assert [layer.num_copies for layer in offloaded] == [8, 8]
