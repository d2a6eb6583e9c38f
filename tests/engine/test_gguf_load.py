"""GGUF files load directly: the packaged SmolLM2 Q4_1 file against the HF folder converted from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import LLM
from engine.model_store import GGUF_WEIGHTS, packaged_gguf, resolve_model
from engine.models.arch_config import ArchConfig
from engine.models.gguf_reader import hf_name, unpermute_heads
from engine.models.loader import checkpoint_tensors
from tests.engine.quant_support import TEXT_PROMPTS


@pytest.fixture(scope="module")
def gguf_folder() -> Path:
    """The metadata folder of the packaged GGUF file (written on first use, ~7 s, then cached)."""
    return resolve_model(str(packaged_gguf()))


def test_gguf_names_map_to_checkpoint_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    with pytest.raises(KeyError):
        hf_name("blk.0.ffn_gate_exps.weight")


def test_unpermute_heads_inverts_the_llama_cpp_permute() -> None:
    num_heads, head_dim = 3, 4
    weight = torch.arange(num_heads * head_dim * 2, dtype=torch.float32).reshape(num_heads * head_dim, 2)
    # llama.cpp's convert_hf_to_gguf permute: per head, the rotary halves' rows interleaved.
    permuted = weight.reshape(num_heads, 2, head_dim // 2, 2).transpose(1, 2).reshape(weight.shape)
    assert permuted[:4, 0].tolist() == [0.0, 4.0, 2.0, 6.0]
    assert torch.equal(unpermute_heads(permuted, num_heads), weight)


def test_gguf_folder_holds_metadata_only_and_links_the_file(gguf_folder: Path, smollm2_path: Path) -> None:
    assert gguf_folder.parent.name == "gguf"
    assert (gguf_folder / GGUF_WEIGHTS).resolve() == packaged_gguf().resolve()
    assert not list(gguf_folder.glob("*.safetensors"))
    ours, converted = (json.loads((f / "config.json").read_text()) for f in (gguf_folder, smollm2_path))
    assert {k for k in ours.keys() | converted.keys() if ours.get(k) != converted.get(k)} == {"dtype"}
    assert resolve_model(str(packaged_gguf())) == gguf_folder


@pytest.mark.slow
def test_gguf_tensors_equal_the_converted_folder_bit_for_bit(gguf_folder: Path, smollm2_path: Path) -> None:
    cfg = ArchConfig.from_folder(gguf_folder)
    ours = dict(checkpoint_tensors(gguf_folder, cfg))
    converted = dict(checkpoint_tensors(smollm2_path, cfg))
    assert sorted(ours) == sorted(converted)
    assert [n for n in ours if not torch.equal(ours[n], converted[n])] == []


@pytest.mark.slow
def test_gguf_greedy_output_is_token_identical_to_the_converted_folder(gguf_folder: Path, smollm2_path: Path) -> None:
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    direct = LLM(str(packaged_gguf()), dtype="float32", num_blocks=256)
    converted = LLM(str(smollm2_path), num_blocks=256)
    assert direct.engine.model_path == gguf_folder
    ids = [converted.tokenizer.encode(p) for p in TEXT_PROMPTS]
    assert [direct.tokenizer.encode(p) for p in TEXT_PROMPTS] == ids
    ours = [o.outputs[0].token_ids for o in direct.generate(ids, params, use_tqdm=False)]
    theirs = [o.outputs[0].token_ids for o in converted.generate(ids, params, use_tqdm=False)]
    assert ours == theirs
    assert (
        direct.generate("The capital of France is", SamplingParams(max_tokens=3, temperature=0.0))[0].outputs[0].text
        == " Paris.\n"
    )
