"""Named architecture shapes for random-weight models (benchmarks on GPUs, where weights cannot travel).

`shape:<name>` resolves to a generated folder holding only config.json; run it with load_format="dummy".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "eos_token_id": 151645,
}
_LLAMA3 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "eos_token_id": 128009,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}

MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        **_QWEN3,
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **_QWEN3,
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
    # Qwen3-30B-A3B: 128 experts of 768 rows, 8 per token (3.3B of the 30.5B parameters active per token).
    "qwen3-30b-a3b": {
        **_QWEN3,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
    "llama-3.1-8b": {
        **_LLAMA3,
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "tiny-qwen3": {
        **_QWEN3,
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
}

SHAPE_PREFIX = "shape:"


def shape_folder(name: str, root: Path) -> Path:
    """Write (once) and return the config-only folder of shape `name` under `root`."""
    if name not in MODEL_SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(sorted(MODEL_SHAPES))}")
    folder = root / "shapes" / name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    text = json.dumps(MODEL_SHAPES[name], indent=2, sort_keys=True)
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    return folder
