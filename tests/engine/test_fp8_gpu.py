"""FP8 on the GPU: the kernels at the Qwen3-8B shapes, and a random-weight Qwen3 (small config) with FP8 weights
and an FP8 KV cache against the same model in bf16 (prompt logits within stated bounds, greedy agreement printed).

Bounds, as |logit difference| / std of the bf16 logits. E4M3 keeps 3 mantissa bits: rounding errs by up to 2^-4
of a value, about 2.4% RMS. A projection's output sums K such products, so its relative error is about the RMS of
the weight's and the activation's rounding (~3.5%); four layers, with the residual stream carrying the embedding,
keep that order: a mean of ~0.05 std is expected. The bounds (mean 0.15, max 1.0 over every prompt position and
vocabulary entry, about 5 sigma of the expected spread) leave a factor of ~3 for the unknown, yet a wrong scale, a
transposed weight or a misread KV block moves logits by about one std and fails them. The fp8 KV cache adds the
rounding of K and V (same 2.4%) inside attention, hence the slightly wider mean bound (0.2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.fp8_checks import (
    check_fp8_cache_store,
    check_fp8_gemv,
    check_fp8_kv_attention,
    check_fp8_linear_batch,
    check_quantize_rows,
)
from tests.engine.quant_support import greedy, prompt_logits

pytestmark = pytest.mark.gpu

QWEN3_8B_PROJECTIONS = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]
NUM_PROMPTS, PROMPT_LEN, NEW_TOKENS = 8, 200, 32
VARIANTS = {"fp8": {"quantization": "fp8"}, "fp8+kv": {"quantization": "fp8", "kv_cache_dtype": "fp8"}}
BOUNDS = {"fp8": (0.15, 1.0), "fp8+kv": (0.2, 1.0)}


@pytest.mark.parametrize(("n", "k"), QWEN3_8B_PROJECTIONS)
def test_fp8_gemv_at_the_8b_shapes(n: int, k: int) -> None:
    check_fp8_gemv(n, k, torch.bfloat16, "cuda", seed=n + k, bias=False)
    check_fp8_gemv(n, k, torch.float16, "cuda", seed=n - k, bias=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_activation_quantizer_matches_torch(dtype: torch.dtype) -> None:
    check_quantize_rows(64, 12288, dtype, "cuda", seed=0, check_values=True)
    check_quantize_rows(3, 4096, dtype, "cuda", seed=1, check_values=True)


@pytest.mark.parametrize("m", [2, 7, 64, 2048])
def test_fp8_scaled_mm_rows(m: int) -> None:
    check_fp8_linear_batch(m, 6144, 4096, "cuda", seed=m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_attention_on_an_fp8_kv_cache(dtype: torch.dtype) -> None:
    requests = [(4000, 1), (17, 1), (0, 300), (1000, 64), (8191, 1), (0, 1)]
    check_fp8_kv_attention(requests, (32, 8, 128), dtype, "cuda", seed=0)


def test_cache_writer_quantizes_like_torch() -> None:
    check_fp8_cache_store(torch.bfloat16, "cuda", seed=0)


@pytest.fixture(scope="module")
def small_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    hidden = 1024
    # NOTE: initializer_range hidden^-1/2 gives each projection unit gain, so the layers (not the embedding alone)
    # shape the logits and their quantization error shows.
    config = Qwen3Config(vocab_size=4096, hidden_size=hidden, intermediate_size=3072, num_hidden_layers=4,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                         initializer_range=hidden**-0.5)  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("qwen3-small")
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


def small_engine(folder: Path, **kwargs: object) -> LLMEngine:
    return LLMEngine(engine_config(str(folder), device="cuda", dtype="bfloat16", num_blocks=512, **kwargs))


def test_fp8_prompt_logits_within_bounds_of_bf16(small_qwen3: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 4096, (PROMPT_LEN,), generator=gen).tolist() for _ in range(NUM_PROMPTS)]
    reference = small_engine(small_qwen3)
    continuations = greedy(reference, prompts, NEW_TOKENS)
    sequences = [p + c for p, c in zip(prompts, continuations, strict=True)]
    ref_logits = [prompt_logits(reference, s).float() for s in sequences]
    del reference
    for name, kwargs in (
        ("fp8", {"quantization": "fp8"}),
        ("fp8+kv", {"quantization": "fp8", "kv_cache_dtype": "fp8"}),
    ):
        engine = small_engine(small_qwen3, **kwargs)
        assert engine.runner.cuda_graphs is not None
        errors, agreed = [], 0
        for sequence, want in zip(sequences, ref_logits, strict=True):
            got = prompt_logits(engine, sequence).float()
            errors.append((got - want).abs() / want.std())
            agreed += int((got[PROMPT_LEN - 1 : -1].argmax(-1) == want[PROMPT_LEN - 1 : -1].argmax(-1)).sum())
        free_run = greedy(engine, prompts, NEW_TOKENS)
        same = sum(a == b for f, c in zip(free_run, continuations, strict=True) for a, b in zip(f, c, strict=True))
        error = torch.cat([e.flatten() for e in errors])
        total = NUM_PROMPTS * NEW_TOKENS
        print(f"{name}: |dlogit|/std mean {error.mean():.4f} max {error.max():.3f}; greedy agreement teacher-forced "
              f"{agreed}/{total} = {agreed / total:.1%}, free-running {same}/{total} = {same / total:.1%}")  # fmt: skip
        mean_bound, max_bound = BOUNDS[name]
        assert error.mean().item() <= mean_bound and error.max().item() <= max_bound
        del engine
        torch.cuda.empty_cache()
