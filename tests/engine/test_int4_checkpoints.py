"""GPTQ and AWQ checkpoints written by the reference quantizer load to exactly its dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from common.errors import InvalidArgumentError
from engine.layers.quant.int4 import unpack_int4
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.loader import hf_state_dict
from tests.engine.int4_reference import AWQ_ORDER, Int4Format, _pack, quantization_config, write_int4_checkpoint
from tests.engine.model_factory import hf_greedy, make_prompts
from tests.engine.quant_support import greedy

_SHAPE = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
FORMATS = {
    "gptq": Int4Format("gptq"),
    "gptq-act-order": Int4Format("gptq", act_order=True),
    "gptq_v2-asym-act-order": Int4Format("gptq", act_order=True, symmetric=False, checkpoint_format="gptq_v2"),
    "awq": Int4Format("awq", symmetric=False),
}


@pytest.fixture(scope="module")
def float_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folders = {}
    for arch, config in (("qwen3", Qwen3Config(**_SHAPE, head_dim=64)), ("llama", LlamaConfig(**_SHAPE))):
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(arch)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
        folders[arch] = folder
    return folders


def test_packing_matches_the_published_nibble_orders() -> None:
    values = np.arange(8).reshape(1, 8)
    assert _pack(values, 1, list(range(8))).tolist() == [[0x76543210]]
    assert _pack(values, 1, AWQ_ORDER).tolist() == [[0x75316420]]
    word = torch.tensor([[np.int32(np.uint32(0xFEDCBA98).view(np.int32))]])
    assert unpack_int4(word, dim=1).tolist() == [[8, 9, 10, 11, 12, 13, 14, 15]]
    assert unpack_int4(word, dim=0).flatten().tolist() == [8, 9, 10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_loader_reproduces_the_reference_dequantized_weights(
    float_folders: dict[str, Path], tmp_path: Path, arch: str, name: str
) -> None:
    expected = write_int4_checkpoint(float_folders[arch], tmp_path, FORMATS[name])
    engine = LLMEngine(engine_config(str(tmp_path), num_blocks=32))
    loaded = hf_state_dict(engine.runner.model)
    assert sorted(loaded) == sorted(expected)
    unequal = [n for n in expected if not torch.equal(loaded[n], expected[n])]
    assert unequal == []


@pytest.mark.parametrize("name", ["gptq-act-order", "awq"])
def test_int4_checkpoint_greedy_matches_transformers_on_its_dequantized_weights(
    float_folders: dict[str, Path], tmp_path: Path, name: str
) -> None:
    fmt = FORMATS[name]
    expected = write_int4_checkpoint(float_folders["qwen3"], tmp_path / "int4", fmt)
    dense = tmp_path / "dense"
    dense.mkdir()
    save_file({n: t.contiguous() for n, t in expected.items()}, str(dense / "model.safetensors"))
    (dense / "config.json").write_text((float_folders["qwen3"] / "config.json").read_text())
    prompts = make_prompts(vocab_size=512)[:4]
    engine = LLMEngine(engine_config(str(tmp_path / "int4"), quantization=fmt.method, num_blocks=64))
    assert greedy(engine, prompts, 8) == hf_greedy(dense, prompts, 8)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"group_size": 64}, "quantization_config.group_size"), ({"bits": 8}, "quantization_config.bits")],
)
def test_unsupported_int4_settings_fail_at_start_up_naming_the_field(
    float_folders: dict[str, Path], tmp_path: Path, overrides: dict[str, int], field: str
) -> None:
    write_int4_checkpoint(float_folders["llama"], tmp_path, FORMATS["gptq"])
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = quantization_config(FORMATS["gptq"], **overrides)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArgumentError, match="not supported") as caught:
        LLMEngine(engine_config(str(tmp_path), num_blocks=16))
    assert caught.value.field == field


def test_a_method_the_checkpoint_contradicts_fails_naming_the_field(
    float_folders: dict[str, Path], tmp_path: Path
) -> None:
    write_int4_checkpoint(float_folders["llama"], tmp_path, FORMATS["awq"])
    with pytest.raises(InvalidArgumentError, match="'int8' asked for, but the checkpoint is awq-quantized") as caught:
        LLMEngine(engine_config(str(tmp_path), quantization="int8", num_blocks=16))
    assert caught.value.field == "quantization"
