"""The architecture facts a Llama-family decoder needs, read from an HF `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.moe_config import MOE_ARCHITECTURES, MoEConfig
from engine.multimodal.vlm_config import text_decoder_config

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    *MOE_ARCHITECTURES,
)


@dataclass(frozen=True, slots=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    attention_bias: bool
    qk_norm: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    sliding_window: int | None
    torch_dtype: str | None
    eos_token_ids: tuple[int, ...]
    quantization_config: dict[str, Any] | None
    moe: MoEConfig | None = None
    """The expert layers of a mixture-of-experts model; None: every MLP is dense."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ArchConfig:
        raw = text_decoder_config(raw)  # NOTE: a vision-language checkpoint's decoder (LLaVA's text_config)
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"architectures {archs} not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        num_heads = raw["num_attention_heads"]
        # NOTE: transformers 5 nests rope settings in `rope_parameters`; 4.x keeps rope_theta + rope_scaling.
        rope = dict(raw.get("rope_parameters") or {})
        scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        eos = raw.get("eos_token_id")
        use_sliding = raw.get("use_sliding_window", arch in ("MistralForCausalLM", "MixtralForCausalLM"))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=raw.get("sliding_window") if use_sliding else None,
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            quantization_config=raw.get("quantization_config"),
            moe=MoEConfig.from_dict(raw, arch, raw["num_hidden_layers"]) if arch in MOE_ARCHITECTURES else None,
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ArchConfig:
        return cls.from_dict(json.loads((folder / "config.json").read_text()))
