"""Helpers of the correctness and quantization tests: greedy runs and prompt logits through the engine."""

from __future__ import annotations

import torch

from common.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.scheduler_output import ScheduledRequest, SchedulerOutput

GREEDY = SamplingParams(max_tokens=1, temperature=0.0)

# 16 natural-language prompts: quantization error shows on real text, where the argmax is meaningful (on random
# token ids the top logits of a small model sit too close for agreement to say much).
TEXT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "To make a cup of tea, first",
    "The largest planet in our solar system is",
    "import numpy as np\nx = np.",
    "Photosynthesis is the process by which",
    "My favourite book is",
    "The quick brown fox",
    "In 1969, the first humans",
    "A healthy breakfast usually includes",
    "The main difference between a virus and a bacterium is",
    "Dear Sir or Madam, I am writing to",
    "The recipe calls for two cups of",
]


def greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations of `prompts` (EOS ignored), in prompt order."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.req_id].extend(out.new_token_ids)
    return list(outputs.values())


def prompt_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """Logits [len(prompt), vocab] at every prompt position, in one step through the paged KV path."""
    kv = engine.kv_cache_manager
    kv.allocate_slots("logits", len(prompt))
    step = SchedulerOutput(
        [ScheduledRequest("logits", prompt, 0, kv.get_block_ids("logits"), GREEDY, False, prompt, [])]
    )
    inputs = engine.runner.prepare_inputs(step)
    with torch.inference_mode():
        hidden = engine.runner.model(inputs.input_ids, inputs.positions, engine.runner.kv_caches, inputs.metadata)
        logits = engine.runner.model.compute_logits(hidden)
    kv.free("logits")
    return logits
