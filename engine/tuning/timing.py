"""Timing device work for the tuners and the kernel micro-benchmarks: CUDA-graph replays timed with CUDA events.

`time_graph_ms` times a list of calls (each once per replay, the median replay); `time_graph_us` times one call
over rotating weights: the launch costs ~1 us, as in the engine's decode graphs, and no weight is read from the L2
(the rotation's bytes exceed it)."""

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


def time_graph_us(call: Callable[[int], object], num_weights: int, replays: int) -> float:
    """us per call of call(i), i over range(num_weights), from `replays` replays of one graph holding them all."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(num_weights):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(num_weights):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays / num_weights
