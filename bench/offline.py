"""Runs a workload through the engine in-process and times every output token."""

from __future__ import annotations

import time

from tqdm import tqdm

from bench.stats import RequestTiming, RunStats
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


def warm_up(engine: LLMEngine, vocab_size: int) -> None:
    """Compile/allocate once so the first measured request pays no start-up costs."""
    engine.add_request("warmup", [i % vocab_size for i in range(64)], SamplingParams(max_tokens=8, ignore_eos=True))
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
