"""The colocated baseline: this project's engine in the benchmark's own process, no disaggregation.

One `LLMEngine` runs on its engine thread (`AsyncEngine`, as inside a pod); the benchmark's event loop submits
requests on the same schedules it uses against the router and stamps each output as it reaches the loop, as a
client of the router would. Prefill and decode share the engine's batches (chunked prefill), which is what
disaggregation is compared against.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Sequence

import torch

from bench.load_driver import RequestRecord
from bench.stats import RequestTiming
from bench.workloads import RequestSpec
from common.config import add_config_args
from common.sampling_params import SamplingParams
from engine.async_engine import AsyncEngine
from engine.config import ENGINE_FLAG_PARTS, engine_config_from_args
from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


def _engine(model: str, load_format: str, engine_flags: Sequence[str]) -> LLMEngine:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for cls in ENGINE_FLAG_PARTS:
        add_config_args(parser, cls)
    args, _ = parser.parse_known_args(list(engine_flags))
    args.model, args.load_format = model, load_format
    return LLMEngine(engine_config_from_args(args))


class ColocatedTarget:
    """Streams requests through an in-process engine thread; `close()` stops it and frees its GPU memory.

    The engine is configured by the engine flags among `engine_flags` (the pods' flags; others, such as
    --heartbeat-s, are skipped), so that it runs with the very settings the pods run with.
    """

    def __init__(self, model: str, load_format: str, engine_flags: Sequence[str]) -> None:
        engine = _engine(model, load_format, engine_flags)
        self.info = engine.info
        self._engine: AsyncEngine | None = AsyncEngine(engine)
        self._engine.start()

    async def generate(self, spec: RequestSpec, request_id: str) -> RequestRecord:
        if self._engine is None:
            raise RuntimeError("the colocated engine is closed")
        params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
        prompt = list(spec.prompt_token_ids)
        record = RequestRecord(RequestTiming(time.monotonic()), num_prompt_tokens=len(prompt))

        def add(engine: LLMEngine) -> None:
            engine.add_request(request_id, prompt, params)

        try:
            async for output in self._engine.generate(request_id, add):
                now = time.monotonic()
                record.timing.token_times.extend(now for _ in output.new_token_ids)
                record.num_cached_tokens = output.num_cached_tokens
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        return record

    def close(self) -> None:
        """Stop the engine thread and drop the engine, so that cluster pods started next get its GPU memory."""
        if self._engine is None:
            return
        self._engine.stop()
        self._engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            logger.info("colocated engine freed: %.2f GiB still allocated", torch.cuda.memory_allocated() / 2**30)
