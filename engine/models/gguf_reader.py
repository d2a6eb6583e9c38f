"""The tensors of a GGUF file under HF checkpoint names, dequantized to float32.

llama.cpp names tensors `blk.{i}.attn_q.weight` and so on, and for the `llama` architecture stores q_proj and
k_proj with the rows of each head interleaved (its converter's `permute`); `gguf_tensors` renames and un-permutes,
so the tensors equal those transformers produces from the same file (`from_pretrained(gguf_file=...)`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.errors import InvalidArgumentError
from engine.layers.quant.base import NamedTensors
from engine.models.arch_config import ArchConfig

SUPPORTED_TENSOR_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_PERMUTED_ARCHITECTURES = ("llama",)


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; KeyError for a name no layer takes."""
    base, _, attr = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, index, part = base.split(".", 2)
        return f"model.layers.{index}.{_LAYER_NAMES[part]}.{attr}"
    return f"{_GLOBAL_NAMES[base]}.{attr}"


def unpermute_heads(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permute: within each head, rows (0, 2, 4, ..., 1, 3, ...) back to (0, 1, 2, ...)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def gguf_tensors(path: Path, cfg: ArchConfig) -> NamedTensors:
    """Every tensor of the GGUF file at `path` as (HF name, float32 tensor); other tensor types fail, named."""
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    permuted = str(reader.fields["general.architecture"].contents()) in _PERMUTED_ARCHITECTURES
    heads = {"self_attn.q_proj": cfg.num_heads, "self_attn.k_proj": cfg.num_kv_heads} if permuted else {}
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise InvalidArgumentError(
                "model",
                f"{path.name}: tensor {tensor.name} is {tensor.tensor_type.name}; "
                f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}",
            )
        name = hf_name(tensor.name)
        weight = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
        module = name.rsplit(".", 1)[0].split(".", 3)[-1]
        if module in heads:
            weight = unpermute_heads(weight, heads[module])
        yield name, weight
