"""Timing device work for the kernel micro-benchmarks: CUDA-graph replays timed with CUDA events."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def time_graph_ms(calls: Sequence[Callable[[], object]], replays: int = 20) -> float:
    """Median ms per call of one CUDA graph that runs every call once (after a warm-up that compiles)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) / len(calls)
