"""Draft-model configuration: errors name `speculative_config.<field>`, a draft of another vocabulary is refused, and
the draft's KV pool comes out of the target's budget, block for block."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from common.errors import InvalidArgumentError
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.config import SpeculativeConfig
from engine.spec.draft_speculator import DraftSpeculator
from tests.engine.model_factory import save_tiny_model


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("target"))


def draft_engine(target: Path, draft: Path | str, **kwargs: object) -> LLMEngine:
    spec = {"method": "draft_model", "model": str(draft)}
    return LLMEngine(engine_config(str(target), speculative_config=spec, **kwargs))


@pytest.mark.parametrize(
    "value", [{"method": "draft_model"}, {"method": "draft_replay"}, {"method": "ngram", "model": "some-folder"}]
)
def test_model_goes_with_the_draft_methods(value: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentError) as error:
        SpeculativeConfig.parse(value)
    assert error.value.field == "speculative_config.model"


def test_missing_draft_folder(target: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as error:
        draft_engine(target, tmp_path / "nothing-here", num_blocks=16)
    assert error.value.field == "speculative_config.model"


def test_other_vocab_size_is_refused(target: Path, tmp_path: Path) -> None:
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    with pytest.raises(InvalidArgumentError, match="vocab_size 256 differs from the target model's 512") as error:
        draft_engine(target, tmp_path, num_blocks=16)
    assert error.value.field == "speculative_config.model"


def write_tokenizer(folder: Path, vocab: dict[str, int]) -> None:
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}))


def test_other_tokenizer_is_refused(target: Path, tmp_path: Path) -> None:
    with_tokenizer, draft = tmp_path / "target", tmp_path / "draft"
    shutil.copytree(target, with_tokenizer)
    shutil.copytree(target, draft)
    write_tokenizer(with_tokenizer, {"a": 0, "b": 1})
    write_tokenizer(draft, {"a": 1, "b": 0})
    with pytest.raises(InvalidArgumentError, match="tokenizer differs") as error:
        draft_engine(with_tokenizer, draft, num_blocks=16)
    assert error.value.field == "speculative_config.model"
    write_tokenizer(draft, {"a": 0, "b": 1})
    assert isinstance(draft_engine(with_tokenizer, draft, num_blocks=16).speculator, DraftSpeculator)


def test_draft_kv_comes_out_of_the_pool_budget(target: Path, tmp_path: Path) -> None:
    """The tiny qwen3 (2 layers, 2 KV heads of 32) beside a tiny llama draft (2 layers, 2 KV heads of 16), float32,
    16-token blocks: 16 KiB and 8 KiB per block, so a 3 MiB budget holds 128 blocks of both (without a draft, 192)."""
    draft = save_tiny_model("llama", tmp_path / "draft", seed=1)
    gib = 3 / 1024
    plain = LLMEngine(engine_config(str(target), kv_cache_memory_gib=gib))
    engine = draft_engine(target, draft, kv_cache_memory_gib=gib)
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator)
    draft_runner = speculator.draft.runner
    assert (plain.runner.block_nbytes, engine.runner.block_nbytes, draft_runner.block_nbytes) == (16384, 16384, 8192)
    assert (plain.runner.num_blocks, engine.runner.num_blocks, draft_runner.num_blocks) == (192, 128, 128)
    assert draft_runner.kv_cache.shape[0] == 128


def test_the_target_offload_budget_leaves_the_draft_whole(target: Path, tmp_path: Path) -> None:
    """A budget of one byte offloads both layers of the tiny target (one layer's bytes must be saved, and one staging
    set stays); the draft keeps every layer on its device."""
    engine = draft_engine(target, save_tiny_model("llama", tmp_path / "draft", seed=1), cpu_offload_gb=2**-30)
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator)
    assert (len(engine.runner.offloaded_layers), len(speculator.draft.runner.offloaded_layers)) == (2, 0)
