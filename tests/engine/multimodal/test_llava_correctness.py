"""Image prompts on a random-weight LLaVA: greedy output token-identical to transformers (CPU, float32), with the
prefix cache keyed by the images (equal token ids with different images never share KV) and images split over
prefill chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.errors import InvalidArgumentError
from common.multimodal import ImageInput, block_token_ids
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.multimodal.vlm_factory import (
    GREEDY,
    NEW_TOKENS,
    NUM_IMAGE_TOKENS,
    greedy_one_by_one,
    hf_llava_greedy,
    image_prompts,
    save_tiny_llava,
)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[list[int], list[ImageInput]]], Any]:
    folder = save_tiny_llava(tmp_path_factory.mktemp("llava"))
    prompts = image_prompts()
    expected = hf_llava_greedy(folder, [(ids, [i.data for i in images]) for ids, images in prompts], NEW_TOKENS)
    assert expected[0] != expected[1]  # the image decides the output: equal token ids, different images
    return folder, prompts, expected


SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("unchunked", {}),
    ("chunk-7-async", {"long_prefill_token_threshold": 7, "async_scheduling": True}),
]


@pytest.mark.parametrize(("name", "kwargs"), SETTINGS, ids=[s[0] for s in SETTINGS])
def test_image_prompts_match_transformers(llava: Any, name: str, kwargs: dict[str, Any]) -> None:
    folder, prompts, expected = llava
    engine = LLMEngine(engine_config(str(folder), num_blocks=256, **kwargs))
    assert greedy_one_by_one(engine, prompts, "a") == expected
    # the images' own prompts again: served from the prefix cache, same tokens
    hits_before = engine.kv_cache_manager.stats.hits
    assert greedy_one_by_one(engine, prompts, "b") == expected
    assert engine.kv_cache_manager.stats.hits - hits_before >= len(prompts) * 16


def test_different_images_never_share_blocks(llava: Any) -> None:
    folder, prompts, _ = llava
    engine = LLMEngine(engine_config(str(folder), num_blocks=256))
    (ids_a, images_a), (ids_b, images_b) = prompts[0], prompts[1]
    assert ids_a == ids_b and images_a != images_b
    greedy_one_by_one(engine, [prompts[0]], "a")
    _, cached = engine.kv_cache_manager.get_computed_blocks("probe", ids_b)
    assert cached == 0  # the plain token ids (placeholders as they are) find nothing either
    kv = engine.kv_cache_manager
    assert kv.get_computed_blocks("probe-b", block_token_ids(ids_b, images_b))[1] == 0
    assert kv.get_computed_blocks("probe-a", block_token_ids(ids_a, images_a))[1] == 32


def test_bad_images_are_invalid_arguments(llava: Any) -> None:
    folder, prompts, _ = llava
    engine = LLMEngine(engine_config(str(folder), num_blocks=64))
    ids, images = prompts[0]
    broken = ImageInput.of(b"\x89PNG\r\n\x1a\nnot really", images[0].offset, NUM_IMAGE_TOKENS)
    with pytest.raises(InvalidArgumentError, match="not a decodable PNG or JPEG") as info:
        engine.add_request("x", ids, GREEDY, images=[broken])
    assert info.value.field == "images[0]"
    shifted = ImageInput.of(images[0].data, images[0].offset - 1, NUM_IMAGE_TOKENS)
    with pytest.raises(InvalidArgumentError, match="image token 500"):
        engine.add_request("y", ids, GREEDY, images=[shifted])
    assert not engine.has_unfinished_requests()
