"""Runs a workload through the engine in-process and times every output token."""

from __future__ import annotations

import time

from tqdm import tqdm

from bench.reporting.stats import RequestTiming, RunStats
from bench.workloads import RequestSpec, Workload
from common.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine


def _params(spec: RequestSpec) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)


def _drain(engine: LLMEngine, timings: dict[str, RequestTiming], bar: tqdm) -> None:
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            timings[out.req_id].token_times.extend(now for _ in out.new_token_ids)
            if out.finished:
                bar.update(1)


def warm_up(engine: LLMEngine, vocab_size: int, prompt_len: int = 64, num_requests: int = 1) -> None:
    """Compile, allocate and settle once, so that no measured request pays start-up costs: `num_requests` requests
    one after another, each of `prompt_len` tokens (distinct prompts, no prefix of a workload's: the prefix cache
    does not serve them).

    NOTE: the workload's longest prompt, a few times: a 64-token warm-up left a 2,048-token prefill's first runs (the
    GEMMs of that shape, the allocations of its activations, the GPU's clocks) in the measured W2 requests, which took
    56, 47, 44, 42 ms before settling at 35-38 ms (fp8, H100)."""
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for r in range(num_requests):
        engine.add_request(f"warmup-{r}", [(i + 7919 * r) % vocab_size for i in range(prompt_len)], params)
        while engine.has_unfinished_requests():
            engine.step()


def run_workload(engine: LLMEngine, workload: Workload, show_progress: bool = True) -> RunStats:
    timings: dict[str, RequestTiming] = {}
    with tqdm(total=len(workload.requests), desc=workload.name, unit="req", disable=not show_progress) as bar:
        start = time.perf_counter()
        for i, spec in enumerate(workload.requests):
            timings[str(i)] = RequestTiming(time.perf_counter())
            engine.add_request(str(i), spec.prompt_token_ids, _params(spec))
            if workload.sequential:
                _drain(engine, timings, bar)
        _drain(engine, timings, bar)
        duration = time.perf_counter() - start
    return RunStats(list(timings.values()), duration)
