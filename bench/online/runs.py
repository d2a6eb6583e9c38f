"""W5 (online rate sweep), W2-online (TTFT through the router vs colocated) and W9 (prefix hits), plus the
pieces W7 shares: warm-up, a Poisson rate sweep, and the colocated engine's phase."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from bench.online.arrivals import parse_rates, poisson_arrivals
from bench.online.cluster_target import ModelChoice, colocated_flags, serving
from bench.online.load_driver import RequestRecord, RunResult, Send, run_closed_loop, run_poisson, run_sequential
from bench.online.load_driver import summarize as summarize_run
from bench.online.router_client import RouterTarget
from bench.workloads import RequestSpec, fixed_requests, mixed_requests, shared_prefix_requests

if TYPE_CHECKING:
    from bench.online.colocated import ColocatedTarget

T = TypeVar("T")
Generate = Callable[[RequestSpec, str], Coroutine[Any, Any, RequestRecord]]
MakeSpecs = Callable[[float, int], list[RequestSpec]]
"""(rate, number of requests) -> the requests of that rate."""
Judge = Callable[[float, RunResult], dict[str, Any]]

_SATURATED_FRACTION = 0.5
_W2_TARGET_RATIO = 1.2


def router_target(args: argparse.Namespace, address: str) -> RouterTarget:
    return RouterTarget(address, args.request_timeout_s)


def with_colocated(
    args: argparse.Namespace, model: ModelChoice, body: Callable[[ColocatedTarget], Coroutine[Any, Any, T]]
) -> T:
    """Run `body(target)` against this project's engine in a colocated engine core process, which ends (its GPU
    memory freed) before anything else starts."""
    from bench.online.colocated import ColocatedTarget

    async def run() -> T:
        async with ColocatedTarget.open(model.model, model.load_format, colocated_flags(args, model)) as target:
            return await body(target)

    return asyncio.run(run())


def sender(generate: Generate, specs: list[RequestSpec], id_prefix: str) -> Send:
    """`send(i)` of the load drivers: request i of `specs`, with a request id of its own."""
    return lambda i: generate(specs[i], f"{id_prefix}-{i}")


async def warm_up(args: argparse.Namespace, generate: Generate, vocab_size: int, input_len: int) -> None:
    """--warmup-prompts requests at once (compiles, autotuning, first batches), results dropped."""
    specs = fixed_requests(vocab_size, args.warmup_prompts, input_len, min(args.output_len, 8), f"{args.seed}-warmup")
    send = sender(generate, specs, f"{args.run_id}-warmup")
    await run_closed_loop(send, len(specs), len(specs), "warm-up", args.progress)


def num_requests(args: argparse.Namespace, rate: float) -> int:
    if args.num_prompts is not None:
        return int(args.num_prompts)
    return 10 if math.isinf(rate) else max(10, round(rate * args.duration_s))


async def sweep_rates(
    args: argparse.Namespace, name: str, generate: Generate, make_specs: MakeSpecs, judge: Judge
) -> list[dict[str, Any]]:
    """One Poisson run per --request-rates rate (arrivals seeded by rate: the same for every system compared);
    `judge(rate, result)` adds its figures, and a true "saturated" among them ends the sweep early."""
    rows: list[dict[str, Any]] = []
    for rate in parse_rates(args.request_rates):
        n = num_requests(args, rate)
        send = sender(generate, make_specs(rate, n), f"{args.run_id}-{name}-{rate:g}")
        arrivals = poisson_arrivals(rate, n, f"{args.seed}-arrivals-{rate}")
        result = await run_poisson(send, arrivals, f"{name} {rate:g} req/s", args.progress)
        row = {"offered_req_per_s": rate} | summarize_run(result) | judge(rate, result)
        rows.append(row)
        if args.stop_at_saturation and row.get("saturated"):
            break
    return rows


def run_w5(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    async def body(address: str) -> dict[str, Any]:
        async with router_target(args, address) as target:
            vocab_size = (await target.model_info()).vocab_size
            await warm_up(args, target.generate, vocab_size, args.input_len)

            def make_specs(rate: float, n: int) -> list[RequestSpec]:
                return mixed_requests(vocab_size, n, args.input_len, args.output_len, f"{args.seed}-w5-{rate}")

            def judge(rate: float, result: RunResult) -> dict[str, Any]:
                return {"saturated": len(result.completed) / result.duration_s < _SATURATED_FRACTION * rate}

            return {"rates": await sweep_rates(args, "w5", target.generate, make_specs, judge)}

    with serving(args, model) as cluster:
        return asyncio.run(body(cluster.address))


async def _sequential(args: argparse.Namespace, name: str, generate: Generate, specs: list[RequestSpec]) -> RunResult:
    return await run_sequential(sender(generate, specs, f"{args.run_id}-{name}"), len(specs), name, args.progress)


def run_w2online(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    """TTFT of one request at a time: this project's engine (a colocated engine core process), then the same prompts
    through the router (one prefill + one decode pod by default)."""

    async def colocated(target: ColocatedTarget) -> tuple[int, dict[str, Any]]:
        vocab_size = target.info.vocab_size
        await warm_up(args, target.generate, vocab_size, args.input_len)
        specs = fixed_requests(vocab_size, args.num_prompts, args.input_len, args.output_len, f"{args.seed}-w2")
        return vocab_size, summarize_run(await _sequential(args, "colocated", target.generate, specs))

    vocab_size, colocated_summary = with_colocated(args, model, colocated)

    async def routed(address: str) -> dict[str, Any]:
        async with router_target(args, address) as target:
            await warm_up(args, target.generate, vocab_size, args.input_len)
            specs = fixed_requests(vocab_size, args.num_prompts, args.input_len, args.output_len, f"{args.seed}-w2")
            return summarize_run(await _sequential(args, "router", target.generate, specs))

    with serving(args, model) as cluster:
        router_summary = asyncio.run(routed(cluster.address))
    ratios: dict[str, float] = {}
    for q in (50, 90):
        key = f"ttft_ms_p{q}"
        ratios[f"ttft_ratio_p{q}"] = router_summary.get(key, math.nan) / colocated_summary.get(key, math.nan)
    return {
        "colocated": colocated_summary,
        "router": router_summary,
        **ratios,
        "target_ratio": _W2_TARGET_RATIO,
        "within_target": ratios["ttft_ratio_p50"] <= _W2_TARGET_RATIO,
    }


def run_w9(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    """TTFT with and without a prefix hit: requests sharing one --prefix-len system prompt (the first one cold,
    the rest hitting its cached blocks), then requests of the same length with a prefix each of their own."""

    async def body(address: str) -> dict[str, Any]:
        async with router_target(args, address) as target:
            info = await target.model_info()
            total_len = args.prefix_len + args.input_len
            await warm_up(args, target.generate, info.vocab_size, total_len)
            shared = shared_prefix_requests(
                info.vocab_size,
                args.num_prompts + 1,
                args.prefix_len,
                args.input_len,
                args.output_len,
                f"{args.seed}-w9-shared",
            )
            distinct = fixed_requests(info.vocab_size, args.num_prompts, total_len, args.output_len, f"{args.seed}-w9")
            shared_run = await _sequential(args, "w9-shared", target.generate, shared)
            distinct_run = await _sequential(args, "w9-distinct", target.generate, distinct)
        first, rest = shared_run.records[0], shared_run.records[1:]
        hits_start = rest[0].timing.start if rest else shared_run.start
        hits = RunResult(rest, shared_run.start + shared_run.duration_s - hits_start, hits_start)
        hit, miss = summarize_run(hits), summarize_run(distinct_run)
        return {
            "block_size": info.block_size,
            "expected_cached_tokens": args.prefix_len // info.block_size * info.block_size,
            "first_request": {
                "ttft_ms": first.timing.ttft * 1000 if first.error is None else None,
                "cached_tokens": first.num_cached_tokens,
                "error": first.error,
            },
            "prefix_hit": hit | _cached_range(hits),
            "no_prefix_hit": miss | _cached_range(distinct_run),
            "ttft_p50_speedup": miss.get("ttft_ms_p50", math.nan) / hit.get("ttft_ms_p50", math.nan),
        }

    with serving(args, model) as cluster:
        return asyncio.run(body(cluster.address))


def _cached_range(result: RunResult) -> dict[str, Any]:
    cached = [r.num_cached_tokens for r in result.completed]
    return {"min_cached_tokens": min(cached, default=None), "max_cached_tokens": max(cached, default=None)}
