"""Offline API: `LLM(model=...).generate(prompts, SamplingParams(...))`, plus per-step streaming."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from tqdm import tqdm
from transformers import AutoTokenizer

from common.sampling_params import SamplingParams
from engine.config import DEFAULT_MODEL, ENGINE_CONFIG_PARTS, EngineConfig, ModelConfig
from engine.llm_engine import LLMEngine
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.spec.config import SpeculativeConfig

Prompt = str | list[int]


def engine_config(model: str = DEFAULT_MODEL, **kwargs: Any) -> EngineConfig:
    """An EngineConfig from flat keyword arguments (any field of ModelConfig, CacheConfig, SchedulerConfig,
    ParallelConfig, and `speculative_config`: a dict, a JSON string or a SpeculativeConfig)."""
    parts: dict[type, dict[str, Any]] = {cls: {} for cls in ENGINE_CONFIG_PARTS}
    parts[ModelConfig]["model"] = model
    speculative = SpeculativeConfig.parse(kwargs.pop("speculative_config", None))
    for key, value in kwargs.items():
        owner = next((cls for cls in parts if key in {f.name for f in dataclasses.fields(cls)}), None)
        if owner is None:
            raise TypeError(f"LLM() got an unknown argument {key!r}")
        parts[owner][key] = value
    model_config, cache, scheduler, parallel = (cls(**values) for cls, values in parts.items())
    return EngineConfig(model_config, cache, scheduler, parallel, speculative)


class LLM:
    """Runs the engine in-process (its model in worker processes with `tensor_parallel_size` or
    `pipeline_parallel_size` > 1). Keyword arguments are config fields, e.g. `LLM(max_num_seqs=8)`."""

    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        self.engine = LLMEngine(engine_config(model, **kwargs))
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.engine.model_path))
        self._request_counter = itertools.count()

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in prompt order."""
        prompt_list = _as_list(prompts)
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(prompt_list), desc="generate", unit="req", disable=not use_tqdm) as bar:
            for output in self.stream(prompt_list, sampling_params):
                if output.finished:
                    results[output.request_id] = output
                    bar.update(1)
        return sorted(results.values(), key=lambda o: int(o.request_id))

    def stream(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield each request's cumulative output whenever a step changes it."""
        params = sampling_params or SamplingParams()
        processor = OutputProcessor(self.tokenizer)
        # NOTE: validate every prompt before submitting any, so bad input leaves the engine untouched.
        prepared = [self._tokenize(prompt, params) for prompt in _as_list(prompts)]
        for text, token_ids in prepared:
            request_id = str(next(self._request_counter))
            for child_id, child_params in processor.add_request(request_id, text, token_ids, params):
                self.engine.add_request(child_id, token_ids, child_params)
        while self.engine.has_unfinished_requests():
            changed, to_abort = processor.process(self.engine.step())
            if to_abort:
                self.engine.abort_requests(to_abort)
            yield from changed

    def _tokenize(self, prompt: Prompt, params: SamplingParams) -> tuple[str | None, list[int]]:
        text, token_ids = (prompt, self.tokenizer.encode(prompt)) if isinstance(prompt, str) else (None, list(prompt))
        self.engine.validate(token_ids, params)
        return text, token_ids


def _as_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]
