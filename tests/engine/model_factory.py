"""Test models and the transformers oracle: random-weight checkpoints of real architectures, prompts, greedy outputs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MixtralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

if TYPE_CHECKING:
    from common.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

_COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)

TINY_CONFIGS: dict[str, PretrainedConfig] = {
    "llama": LlamaConfig(
        **_COMMON,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    ),
    "qwen2": Qwen2Config(**_COMMON),
    "qwen3": Qwen3Config(**_COMMON, head_dim=32),
    # Mixture-of-experts: Qwen3-MoE with one dense layer between two sparse ones and renormalized top-k weights;
    # Mixtral (always renormalized) with fewer, wider experts.
    "qwen3_moe": Qwen3MoeConfig(
        **{**_COMMON, "num_hidden_layers": 3},
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    "mixtral": MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2),
}


# NOTE: seeds whose routing is far from ties: over make_prompts' greedy runs the k-th and (k+1)-th expert
# probabilities of every token stay >= 5e-6 apart (qwen3_moe's seed 0 came within 5e-7), so float32 rounding
# differences between the engine and transformers cannot flip an expert choice.
_SEEDS = {"qwen3_moe": 2}


def save_tiny_model(name: str, folder: Path, seed: int | None = None) -> Path:
    """Create the named random-weight model in float32 and save it (config.json + safetensors)."""
    torch.manual_seed(_SEEDS.get(name, 0) if seed is None else seed)
    model = AutoModelForCausalLM.from_config(TINY_CONFIGS[name], dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


NEW_TOKENS = 32


def make_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """16 prompts of 1..300 tokens; some share a 64-token prefix so the prefix cache has work to do."""
    rng = random.Random(seed)
    shared = [rng.randrange(vocab_size) for _ in range(64)]
    lengths = [1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 128, 150, 200, 250, 299, 300]
    prompts = []
    for i, n in enumerate(lengths):
        head = shared[: min(n, 64)] if i % 2 and n > 64 else []
        prompts.append(head + [rng.randrange(vocab_size) for _ in range(n - len(head))])
    return prompts


@torch.no_grad()
def hf_greedy(model_path: Path, prompts: list[list[int]], max_new_tokens: int, device: str = "cpu") -> list[list[int]]:
    """transformers generate(do_sample=False), one prompt at a time (no padding), EOS ignored."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    return [generate_greedy(model, torch.tensor([prompt], device=device), max_new_tokens) for prompt in prompts]


@torch.no_grad()
def generate_greedy(model: Any, ids: torch.Tensor, max_new_tokens: int, **inputs: torch.Tensor) -> list[int]:
    """transformers generate(do_sample=False) of exactly `max_new_tokens` after the one prompt `ids` [1, T] (EOS
    ignored); `inputs`: the model's other inputs (e.g. pixel_values)."""
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=None,
        **inputs,
    )
    return out[0, ids.shape[1] :].tolist()


def step_to_end(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Add `prompts` (request ids "0", "1", ...) and step `engine` until nothing is left; each prompt's tokens."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.req_id] += output.new_token_ids
    return [tokens[str(i)] for i in range(len(prompts))]
