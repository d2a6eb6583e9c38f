"""Where a decode step's time goes on the GPU: busy kernels vs idle gaps, from the torch profiler's device timeline.

`profile_decode` fills the engine with `batch_size` requests, lets them reach steady decode, then records
`num_steps` engine steps. GPU idle time = the recorded span minus the union of kernel and memcpy intervals: the
time the GPU waited for the host (scheduling, input preparation, sampling bookkeeping) between and inside steps.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from common.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine


@dataclass(frozen=True, slots=True)
class DeviceInterval:
    name: str
    start_us: float
    end_us: float


def busy_time_us(intervals: list[DeviceInterval]) -> float:
    """Length of the union of the intervals (overlapping kernels on several streams count once)."""
    busy, reach = 0.0, float("-inf")
    for interval in sorted(intervals, key=lambda i: i.start_us):
        start = max(interval.start_us, reach)
        if interval.end_us > start:
            busy += interval.end_us - start
        reach = max(reach, interval.end_us)
    return busy


def device_intervals(prof: profile) -> list[DeviceInterval]:
    return [
        DeviceInterval(event.name, event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == DeviceType.CUDA
    ]


def timeline_summary(intervals: list[DeviceInterval], num_steps: int, top: int = 12) -> dict[str, Any]:
    """Span, busy and idle time per step, and the kernels that take the most time."""
    span = max(i.end_us for i in intervals) - min(i.start_us for i in intervals)
    busy = busy_time_us(intervals)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for interval in intervals:
        entry = by_name[interval.name]
        entry[0] += interval.end_us - interval.start_us
        entry[1] += 1
    heaviest = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "gpu_span_us_per_step": span / num_steps,
        "gpu_busy_us_per_step": busy / num_steps,
        "gpu_idle_fraction": 1.0 - busy / span,
        "kernels_per_step": len(intervals) / num_steps,
        "top_kernels": [
            {"name": name[:90], "us_per_step": total / num_steps, "calls_per_step": count / num_steps}
            for name, (total, count) in heaviest
        ],
    }


def profile_decode(
    engine: LLMEngine, batch_size: int, context_len: int, num_steps: int, warmup_steps: int = 8
) -> dict[str, Any]:
    """Time `num_steps` steady decode steps of `batch_size` requests of `context_len` prompt tokens, then record
    as many more with the profiler (wall time per step comes from the unrecorded ones)."""
    vocab = engine.info.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=warmup_steps + 2 * num_steps + 8, ignore_eos=True)
    for index in range(batch_size):
        prompt = [(index * 7919 + j * 104729) % vocab for j in range(context_len)]
        engine.add_request(f"profile-{index}", prompt, params)
    # NOTE: the prefill steps and the first decode steps (lazy allocations, autotuning) stay out of the record.
    while engine.scheduler.waiting or _prefilling(engine):
        engine.step()
    for _ in range(warmup_steps):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    # NOTE: device activity only: recording host ops too would slow the host and inflate the idle gaps.
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            engine.step()
        torch.cuda.synchronize()
    engine.abort_requests([f"profile-{index}" for index in range(batch_size)])
    while engine.has_unfinished_requests():
        engine.step()
    summary = timeline_summary(device_intervals(prof), num_steps)
    return {
        "batch_size": batch_size,
        "context_len": context_len,
        "wall_us_per_step": wall_s / num_steps * 1e6,
    } | summary


def _prefilling(engine: LLMEngine) -> bool:
    return any(r.num_computed_tokens < r.num_tokens - 1 for r in engine.scheduler.running)
