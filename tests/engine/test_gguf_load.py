"""GGUF files load directly: the packaged SmolLM2 Q4_1 file against the HF folder converted from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.llm import LLM
from engine.model_store import GGUF_WEIGHTS, packaged_gguf, resolve_model
from engine.models.arch_config import ArchConfig
from engine.models.gguf_reader import gguf_tensors, hf_name, unpermute_heads
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


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType]]) -> None:
    """A qwen3 GGUF holding `tensors` (name: (stored array, its type)) and no other metadata."""
    writer = GGUFWriter(str(path), "qwen3")
    for name, (stored, qtype) in tensors.items():
        writer.add_tensor(name, stored, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_each_supported_tensor_type_dequantizes_exactly(tmp_path: Path) -> None:
    # Values each type represents exactly: blocks of 32 whose scale comes out 1 (Q4_0: -8..7; Q8_0: +-127 and more).
    q4 = np.tile(np.arange(-8, 8, dtype=np.float32), 8).reshape(4, 32)
    q8 = np.tile(np.concatenate([[-127, 127], np.arange(-15, 15)]).astype(np.float32), 8).reshape(2, 128)
    f16 = (np.arange(64, dtype=np.float16) / 8).reshape(2, 32)
    f32 = np.linspace(-1, 1, 32, dtype=np.float32)
    _write_gguf(
        tmp_path / "t.gguf",
        {
            "blk.0.attn_q.weight": (quants.quantize(q4, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0),
            "blk.0.ffn_down.weight": (quants.quantize(q8, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0),
            "blk.0.attn_k.weight": (f16, GGMLQuantizationType.F16),
            "blk.0.attn_norm.weight": (f32, GGMLQuantizationType.F32),
        },
    )
    # NOTE: qwen3 stores q/k as they are (only llama's are permuted), so the arch config is not read.
    loaded = dict(gguf_tensors(tmp_path / "t.gguf", None))  # type: ignore[arg-type]
    assert torch.equal(loaded["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(q4))
    assert torch.equal(loaded["model.layers.0.mlp.down_proj.weight"], torch.from_numpy(q8))
    assert torch.equal(loaded["model.layers.0.self_attn.k_proj.weight"], torch.from_numpy(f16).float())
    assert torch.equal(loaded["model.layers.0.input_layernorm.weight"], torch.from_numpy(f32))


def test_an_unsupported_tensor_type_fails_naming_it(tmp_path: Path) -> None:
    one_q6_k_block = np.zeros((1, 210), np.uint8)  # 256 weights in 210 bytes
    _write_gguf(tmp_path / "k.gguf", {"blk.0.ffn_down.weight": (one_q6_k_block, GGMLQuantizationType.Q6_K)})
    expected = r"tensor blk\.0\.ffn_down\.weight is Q6_K; supported: F32, F16, Q8_0, Q4_0, Q4_1"
    with pytest.raises(InvalidArgumentError, match=expected) as caught:
        list(gguf_tensors(tmp_path / "k.gguf", None))  # type: ignore[arg-type]
    assert caught.value.field == "model"


def test_gguf_folder_holds_metadata_only_and_links_the_file(gguf_folder: Path, smollm2_path: Path) -> None:
    assert gguf_folder.parent.name == "gguf"
    assert (gguf_folder / GGUF_WEIGHTS).resolve() == packaged_gguf().resolve()
    assert not list(gguf_folder.glob("*.safetensors"))
    ours, converted = (json.loads((f / "config.json").read_text()) for f in (gguf_folder, smollm2_path))
    # NOTE: transformers_version names whichever transformers wrote each folder (the converted one may be older).
    differing = {k for k in ours.keys() | converted.keys() if ours.get(k) != converted.get(k)}
    assert differing - {"transformers_version"} == {"dtype"}
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
