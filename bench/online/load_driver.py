"""How an online benchmark sends its requests, and what it keeps of each.

A run sends requests through `send(i)` (an async call that streams request i to its end and returns its
`RequestRecord`) in one of three patterns: on a Poisson schedule (open loop), one at a time, or from a fixed
number of concurrent clients (closed loop). Every time is `time.monotonic()`, taken by the caller as each
streamed message arrives, so records from several client processes of one machine share one clock.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from bench.reporting.stats import RequestTiming, RunStats, percentile, percentiles_ms

_MAX_ERRORS_SHOWN = 3


@dataclass(slots=True)
class RequestRecord:
    """One request as its client saw it; `timing.token_times` holds one entry per output token."""

    timing: RequestTiming
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (the response's usage.cached_prompt_tokens)."""
    server_ttft_s: float | None = None
    """The router's own TTFT (metrics.time_to_first_token: arrival at the router -> first token leaving it)."""
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0
    error: str | None = None
    """The failure (gRPC status name and details), None when the request completed."""


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    duration_s: float
    """From the first request sent to the last one finished."""
    start: float = 0.0
    """time.monotonic() at the run's start."""
    send_lags_s: list[float] = field(default_factory=list)
    """Open loop: how late each request left against its schedule (the client falling behind)."""

    @property
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None and r.timing.token_times]

    @property
    def num_failed(self) -> int:
        return len(self.records) - len(self.completed)


Send = Callable[[int], Coroutine[Any, Any, RequestRecord]]


def _bar(total: int, desc: str, show: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="req", disable=not show, mininterval=1.0, leave=False)


async def run_poisson(send: Send, arrivals: list[float], desc: str, show_progress: bool = True) -> RunResult:
    """Send request i at `arrivals[i]` seconds after the start, whatever is still in flight (open loop)."""
    lags: list[float] = []
    tasks: list[asyncio.Task[RequestRecord]] = []
    with _bar(len(arrivals), desc, show_progress) as bar:
        start = time.monotonic()
        for i, offset in enumerate(arrivals):
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(max(0.0, time.monotonic() - start - offset))
            task = asyncio.create_task(send(i))
            task.add_done_callback(lambda _: bar.update(1))
            tasks.append(task)
        records = list(await asyncio.gather(*tasks))
        duration = time.monotonic() - start
    return RunResult(records, duration, start, lags)


async def run_sequential(send: Send, num_requests: int, desc: str, show_progress: bool = True) -> RunResult:
    """Send each request after the previous one finished (latency without queueing)."""
    records: list[RequestRecord] = []
    with _bar(num_requests, desc, show_progress) as bar:
        start = time.monotonic()
        for i in range(num_requests):
            records.append(await send(i))
            bar.update(1)
        duration = time.monotonic() - start
    return RunResult(records, duration, start)


async def run_closed_loop(
    send: Send, num_requests: int, concurrency: int, desc: str, show_progress: bool = True
) -> RunResult:
    """`concurrency` clients, each sending its next request as soon as its last one finished."""
    indices = itertools.count()
    records: list[RequestRecord | None] = [None] * num_requests

    async def client() -> None:
        while (i := next(indices)) < num_requests:
            records[i] = await send(i)
            bar.update(1)

    with _bar(num_requests, desc, show_progress) as bar:
        start = time.monotonic()
        await asyncio.gather(*(client() for _ in range(min(concurrency, num_requests))))
        duration = time.monotonic() - start
    return RunResult([r for r in records if r is not None], duration, start)


def merge(results: list[RunResult]) -> RunResult:
    """One run of several clients' runs made at the same time (e.g. one per client process)."""
    start = min(r.start for r in results)
    end = max(r.start + r.duration_s for r in results)
    records = [record for r in results for record in r.records]
    return RunResult(records, end - start, start, [lag for r in results for lag in r.send_lags_s])


def summarize(result: RunResult) -> dict[str, Any]:
    """RunStats' latency and throughput figures of the completed requests, plus failures, prompt and cache
    token counts, and where known the router's own TTFT, the KV transfers and the client's send lag."""
    done = result.completed
    out: dict[str, Any] = RunStats([r.timing for r in done], result.duration_s).summary() if done else {}
    out["requests"] = len(done)
    out["failed"] = result.num_failed
    errors = [r.error for r in result.records if r.error is not None]
    if errors:
        out["errors"] = errors[:_MAX_ERRORS_SHOWN]
    if done:
        out["mean_prompt_tokens"] = sum(r.num_prompt_tokens for r in done) / len(done)
        out["mean_cached_tokens"] = sum(r.num_cached_tokens for r in done) / len(done)
    served = [r for r in done if r.server_ttft_s is not None]
    if served:
        out |= percentiles_ms("router_ttft_ms", [r.server_ttft_s for r in served if r.server_ttft_s is not None])
        # NOTE: the part of TTFT outside the router's own clock: the gRPC hop there and back, and the client.
        gaps = [r.timing.ttft - r.server_ttft_s for r in served if r.server_ttft_s is not None]
        out |= percentiles_ms("client_minus_router_ttft_ms", gaps)
    transfers = [r for r in done if r.kv_transfer_bytes]
    if transfers:
        out["mean_kv_transfer_bytes"] = sum(r.kv_transfer_bytes for r in transfers) / len(transfers)
        out |= percentiles_ms("kv_transfer_ms", [r.kv_transfer_s for r in transfers])
    if result.send_lags_s:
        out["send_lag_ms_p99"] = percentile(result.send_lags_s, 99) * 1000
    return out
