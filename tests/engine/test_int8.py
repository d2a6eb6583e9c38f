"""int8 weight-only: exact quantizer values, and SmolLM2 in int8 against float32 (agreement and logit error)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.layers.quant.int8 import quantize_int8
from engine.llm import LLM
from tests.engine.quant_support import TEXT_PROMPTS, prompt_logits

NEW_TOKENS = 32
MIN_GREEDY_AGREEMENT = 0.90
# Tolerances relative to the float32 logits' standard deviation (6.8 on the prompt below). int8 per-channel
# rounding errs by at most scale/2 per weight, about 1% of a row's RMS; through 30 residual layers that grows to
# a few percent of the hidden state, hence of the logits: mean |d logit| <= 5% of std (measured 3.2%), and no
# position beyond half a std (measured 0.31 std) so the ranking of clearly separated tokens holds.
MEAN_LOGIT_ERROR_PER_STD = 0.05
MAX_LOGIT_ERROR_PER_STD = 0.5


def test_quantize_int8_is_symmetric_per_output_channel() -> None:
    weight = torch.tensor([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [-2.54, 1.27, 0.01, 2.0]])
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8
    assert q.tolist() == [[127, -64, 32, 0], [0, 0, 0, 0], [-127, 64, 0, 100]]
    assert scale.tolist() == pytest.approx([1 / 127, 1.0, 2.54 / 127])


def test_int8_layers_keep_int8_weights_and_float_embeddings(smollm2_path: Path) -> None:
    llm = LLM(str(smollm2_path), quantization="int8", num_blocks=16)
    model = llm.engine.runner.model
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == torch.int8
    assert layer.mlp.down_proj.get_parameter("weight_scale").shape == (576,)
    assert model.lm_head.weight.dtype == torch.float32
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_quantize_lm_head_runs_the_tied_head_in_int8_beside_the_float_embedding(smollm2_path: Path) -> None:
    llm = LLM(str(smollm2_path), quantization="int8", quantize_lm_head=True, num_blocks=16)
    model = llm.engine.runner.model
    embedding = model.model.embed_tokens.weight
    want_q, want_scale = quantize_int8(embedding)
    assert (model.lm_head.weight.dtype, embedding.dtype) == (torch.int8, torch.float32)
    assert torch.equal(model.lm_head.weight, want_q)
    assert torch.equal(model.lm_head.get_parameter("weight_scale"), want_scale)
    hidden = torch.randn(3, 576, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.compute_logits(hidden), (hidden @ want_q.float().T) * want_scale)


@pytest.mark.parametrize("quantization", ["none", "gptq"])
def test_quantize_lm_head_without_a_method_that_quantizes_at_load_fails_naming_the_field(
    smollm2_path: Path, quantization: str
) -> None:
    # NOTE: random weights stand for a gptq checkpoint (SmolLM2's is float)
    kwargs = {"load_format": "dummy"} if quantization == "gptq" else {}
    with pytest.raises(InvalidArgumentError, match=f"quantization '{quantization}' does not quantize") as caught:
        LLM(str(smollm2_path), quantization=quantization, quantize_lm_head=True, num_blocks=16, **kwargs)
    assert caught.value.field == "quantize_lm_head"


@pytest.mark.slow
def test_int8_smollm2_agrees_with_float32(smollm2_path: Path) -> None:
    """Greedy agreement: float32 generates 32 tokens per prompt; int8, fed the same tokens, picks the same next
    token at >= 90% of those 512 positions (teacher-forced, so one early difference does not decide the rest)."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    reference = LLM(str(smollm2_path), num_blocks=256)
    prompts = [reference.tokenizer.encode(p) for p in TEXT_PROMPTS]
    generated = [o.outputs[0].token_ids for o in reference.generate(prompts, params, use_tqdm=False)]
    reference_logits = prompt_logits(reference.engine, prompts[0] + generated[0])
    del reference
    quantized = LLM(str(smollm2_path), quantization="int8", num_blocks=256)
    agreed = 0
    for prompt, tokens in zip(prompts, generated, strict=True):
        logits = prompt_logits(quantized.engine, prompt + tokens)
        predicted = logits[len(prompt) - 1 : -1].argmax(dim=-1).tolist()
        agreed += sum(p == t for p, t in zip(predicted, tokens, strict=True))
    assert agreed / (len(prompts) * NEW_TOKENS) >= MIN_GREEDY_AGREEMENT, agreed
    error = (prompt_logits(quantized.engine, prompts[0] + generated[0]) - reference_logits).abs()
    std = reference_logits.std().item()
    assert error.mean().item() <= MEAN_LOGIT_ERROR_PER_STD * std, (error.mean().item(), std)
    assert error.max().item() <= MAX_LOGIT_ERROR_PER_STD * std, (error.max().item(), std)


def test_fp8_on_cpu_fails_at_start_up_naming_the_field(smollm2_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"needs a CUDA device with compute capability >= 8\.9") as caught:
        LLM(str(smollm2_path), quantization="fp8", device="cpu", num_blocks=16)
    assert caught.value.field == "quantization"


def test_fp8_kv_cache_on_cpu_fails_at_start_up_naming_the_field(smollm2_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"needs a CUDA device with compute capability >= 8\.9") as caught:
        LLM(str(smollm2_path), kv_cache_dtype="fp8", device="cpu", num_blocks=16)
    assert caught.value.field == "kv_cache_dtype"


def test_gptq_on_a_float_checkpoint_fails_naming_the_field(smollm2_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="needs a checkpoint with a quantization_config") as caught:
        LLM(str(smollm2_path), quantization="gptq", num_blocks=16)
    assert caught.value.field == "quantization"
