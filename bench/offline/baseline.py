"""The `transformers` generate baseline on the very same weights (static batches, greedy, EOS ignored)."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bench.workloads import Workload
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import hf_state_dict


def hf_model_with_weights(model_path: str, ours: LlamaForCausalLM) -> Any:
    """An HF model of the same config holding a copy of our model's parameters (under the checkpoint's names)."""
    config = AutoConfig.from_pretrained(model_path)
    param = next(ours.parameters())
    with torch.device(param.device):
        hf = AutoModelForCausalLM.from_config(config, dtype=param.dtype)
    missing, unexpected = hf.load_state_dict(hf_state_dict(ours), strict=False)
    if unexpected or [
        m for m in missing if "rotary" not in m and not (m == "lm_head.weight" and config.tie_word_embeddings)
    ]:
        raise RuntimeError(f"weights do not map onto transformers' model: missing {missing}, unexpected {unexpected}")
    return hf.eval()


@torch.inference_mode()
def run_transformers(hf: Any, workload: Workload, batch_size: int) -> dict[str, float]:
    """Output tok/s (requested tokens only) and ms per decode step of static left-padded batches."""
    device = next(hf.parameters()).device
    specs = workload.requests
    useful_tokens = 0
    start = time.perf_counter()
    for i in range(0, len(specs), batch_size):
        batch = specs[i : i + batch_size]
        width = max(len(s.prompt_token_ids) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, spec in enumerate(batch):
            ids[row, width - len(spec.prompt_token_ids) :] = torch.tensor(spec.prompt_token_ids)
            mask[row, width - len(spec.prompt_token_ids) :] = 1
        new_tokens = max(s.max_tokens for s in batch)
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        useful_tokens += sum(s.max_tokens for s in batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    duration = time.perf_counter() - start
    return {"duration_s": duration, "output_tok_per_s": useful_tokens / duration}
