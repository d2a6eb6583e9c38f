"""cpu_offload_gb: which layers are built in host memory (decided before the model is built), that they are built
there, that each is copied in before it runs, and exact greedy output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from engine.attention.torch_backend import TorchAttentionBackend
from engine.kv_tier.weight_offload import host_layer_range, layers_to_offload
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.arch_config import ArchConfig
from engine.models.loader import build_model, decoder_layer_nbytes
from tests.engine.model_factory import save_tiny_model
from tests.engine.quant_support import greedy

GIB = 2**30
# One decoder layer of the tiny Qwen3 (hidden 64, q/k/v 4/2/2 heads of 32, MLP 128) in float32: q|k|v 256 x 64,
# o 64 x 128, gate|up 256 x 64, down 64 x 128, q/k norms 32 each, two norms 64 each: 49,344 values.
LAYER_NBYTES = 49_344 * 4
BACKEND = TorchAttentionBackend(16, 1.0)


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


@pytest.mark.parametrize(
    ("stage", "gib", "expected"),
    [
        (range(0, 4), 0.0, range(4, 4)),
        (range(0, 4), 1.0, range(2, 4)),
        (range(0, 4), 1.5, range(1, 4)),
        (range(4, 8), 1.0, range(6, 8)),  # a later pipeline stage: its own last layers
    ],
)
def test_host_layers_are_the_picked_layers_of_the_stage(stage: range, gib: float, expected: range) -> None:
    assert host_layer_range(stage, [GIB] * 4, gib) == expected


@pytest.fixture(scope="module")
def qwen3_4_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with 4 decoder layers, random float32 weights."""
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("offload-qwen3-4-layers")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def test_layer_sizes_are_measured_on_meta_without_drawing_random_numbers(qwen3_4_layers: Path, tmp_path: Path) -> None:
    moe = ArchConfig.from_folder(save_tiny_model("qwen3_moe", tmp_path))
    rng_state = torch.get_rng_state()
    assert decoder_layer_nbytes(ArchConfig.from_folder(qwen3_4_layers), BACKEND, torch.float32) == [LAYER_NBYTES] * 4
    # Layers differ in a mixture-of-experts model with a dense layer: 8 experts' w13 and w2, the router and the
    # block's int32 sync counters (one per hidden column) replace the MLP.
    sparse = LAYER_NBYTES + (8 * 64 * 64 + 8 * 64 * 32 + 8 * 64 + 64 - 256 * 64 - 64 * 128) * 4
    assert decoder_layer_nbytes(moe, BACKEND, torch.float32) == [sparse, LAYER_NBYTES, sparse]
    assert torch.equal(torch.get_rng_state(), rng_state)


def test_host_layers_are_built_in_host_memory(qwen3_4_layers: Path) -> None:
    # NOTE: on the `meta` device every tensor not built in host memory is visibly elsewhere.
    cfg = ArchConfig.from_folder(qwen3_4_layers)
    model = build_model(cfg, BACKEND, torch.float32, torch.device("meta"), host_layers=range(2, 4))
    layer_devices = [{t.device.type for t in layer.parameters()} for layer in model.model.layers]
    assert layer_devices == [{"meta"}, {"meta"}, {"cpu"}, {"cpu"}]
    outside = {name.split(".")[-2]: t.device.type for name, t in model.named_parameters() if ".layers." not in name}
    assert outside == {"embed_tokens": "meta", "norm": "meta", "lm_head": "meta"}
    assert model.model.cos_sin.device.type == "meta"


def test_offloaded_model_copies_each_layer_in_and_matches(tiny_qwen3_path: Path) -> None:
    path = tiny_qwen3_path
    rng = random.Random(7)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (5, 40)]
    expected = greedy(LLMEngine(engine_config(str(path), num_blocks=32)), prompts, 8)
    # 0.1 MiB saved needs two layers (the model's both), sharing one staging set.
    engine = LLMEngine(engine_config(str(path), num_blocks=32, cpu_offload_gb=0.1 / 1024))
    offloaded = engine.runner.offloaded_layers
    assert engine.runner.model.model.host_layers == range(0, 2)
    layers = engine.runner.model.model.layers
    assert all(
        p0.data_ptr() == p1.data_ptr() for p0, p1 in zip(layers[0].parameters(), layers[1].parameters(), strict=True)
    )
    assert greedy(engine, prompts, 8) == expected
    # Each step runs both layers once: 1 prefill step of both prompts, then 7 decode steps.
    assert [layer.num_copies for layer in offloaded] == [8, 8]


@pytest.mark.parametrize(
    ("quantization", "gate_up_dtype"), [("none", torch.float32), ("int8", torch.int8)], ids=["float", "int8"]
)
@pytest.mark.parametrize(
    ("cpu_offload_gb", "host_layers"),
    [(LAYER_NBYTES / GIB, range(2, 4)), ((LAYER_NBYTES + 1) / GIB, range(1, 4))],
    ids=["one-layer", "one-layer-and-a-byte"],
)
def test_host_layers_load_finish_and_match(
    qwen3_4_layers: Path, quantization: str, gate_up_dtype: torch.dtype, cpu_offload_gb: float, host_layers: range
) -> None:
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (3, 30, 70)]
    config = {"num_blocks": 32, "quantization": quantization}
    expected = greedy(LLMEngine(engine_config(str(qwen3_4_layers), **config)), prompts, 6)
    engine = LLMEngine(engine_config(str(qwen3_4_layers), cpu_offload_gb=cpu_offload_gb, **config))
    assert engine.runner.model.model.host_layers == host_layers
    offloaded = engine.runner.offloaded_layers
    assert len(offloaded) == len(host_layers)
    # Host layers were finished as device layers are (int8: quantized at load, with their scales).
    host = offloaded[0].host
    assert host["mlp.gate_up_proj.weight"].dtype == gate_up_dtype
    assert ("mlp.gate_up_proj.weight_scale" in host) == (quantization == "int8")
    assert greedy(engine, prompts, 6) == expected
    assert [layer.num_copies for layer in offloaded] == [6] * len(host_layers)


def test_random_weights_of_host_layers_match_on_cpu(qwen3_4_layers: Path) -> None:
    # NOTE: on CPU the host layers draw their random weights from the same generator in the same order; on CUDA they
    # come from the host's generator, the others from the device's, so the weights differ there.
    prompts = [[1, 2, 3, 4, 5], [9] * 20]
    config = {"num_blocks": 16, "load_format": "dummy"}
    expected = greedy(LLMEngine(engine_config(str(qwen3_4_layers), **config)), prompts, 4)
    engine = LLMEngine(engine_config(str(qwen3_4_layers), cpu_offload_gb=LAYER_NBYTES / GIB, **config))
    assert engine.runner.model.model.host_layers == range(2, 4)
    assert greedy(engine, prompts, 4) == expected
