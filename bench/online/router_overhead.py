"""W8 router: the time the router adds to each request, and the streams it serves per second per core.

At each --concurrency level C: N requests (--input-len / --output-len) sent by C concurrent clients (closed
loop, spread over --client-procs processes, each with connections of its own) straight to the pods, the
client making the router's pod calls itself (Reserve, Prefill, Decode: `PodDirectTarget`), then N other
requests of the same lengths through the router (prompts as text by default, so the router tokenizes them).

- `overhead_ms`: router minus direct, of TTFT and end-to-end latency (p50 and mean): the client -> router hop,
  tokenizing, the prefix-directory lookup and routing, and detokenizing and re-streaming every token.
- `router_cpu_ms_per_request`: CPU time of the router process and its children (tokenizer workers) during the
  router phase, per completed request (Linux /proc; needs the router's pid: own cluster or --router-pid).
- `streams_per_s_per_core` = 1000 / that: the streams one core's worth of router CPU serves per second; the
  router's event loop is one thread, so this is about the most one router sustains.
- `router_cpu_cores`: router CPU seconds / wall seconds of the phase (near 1: the router is the bottleneck).
- `streams_per_s`: completed streams per wall second, through the router and direct.
- `client_minus_router_ttft_ms`: client TTFT minus the router's own TTFT (metrics.time_to_first_token).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.online.cluster_target import ModelChoice, pod_addresses, serving
from bench.online.load_driver import RunResult, merge, run_closed_loop, summarize
from bench.online.process_cpu import CpuSnapshot, pod_cpu_ms_per_request
from bench.online.router_client import PodDirectTarget, RouterTarget
from bench.workloads import RequestSpec, fixed_requests
from common.child_process import die_with_parent
from engine.model_store import resolve_model


@dataclass(frozen=True, slots=True)
class ClientJob:
    """What one client process sends (picklable: it crosses to spawned processes)."""

    via_router: bool
    address: str
    prefill_addresses: tuple[str, ...]
    decode_addresses: tuple[str, ...]
    specs: tuple[RequestSpec, ...]
    texts: tuple[str, ...] | None
    """Text prompts in place of the token ids (router only)."""
    concurrency: int
    num_connections: int
    """Connections to the router (router runs only)."""
    timeout_s: float
    id_prefix: str
    show_progress: bool


def run_client(job: ClientJob) -> RunResult:
    """A client process's whole run: `job.concurrency` streams until its requests are done."""
    return asyncio.run(_run_client(job))


async def _run_client(job: ClientJob) -> RunResult:
    desc = f"{'router' if job.via_router else 'direct'} x{job.concurrency}"
    if job.via_router:
        async with RouterTarget(job.address, job.timeout_s, job.num_connections) as router:
            texts = job.texts
            return await run_closed_loop(
                lambda i: router.generate(job.specs[i], f"{job.id_prefix}-{i}", texts[i] if texts else None),
                len(job.specs),
                job.concurrency,
                desc,
                job.show_progress,
            )
    async with PodDirectTarget(job.prefill_addresses, job.decode_addresses, job.timeout_s) as pods:
        return await run_closed_loop(
            lambda i: pods.generate(job.specs[i], f"{job.id_prefix}-{i}"),
            len(job.specs),
            job.concurrency,
            desc,
            job.show_progress,
        )


def split_job(job: ClientJob, num_procs: int) -> list[ClientJob]:
    """The job dealt over `num_procs` processes: every k-th request, and a share of the concurrency."""
    num_procs = max(1, min(num_procs, job.concurrency, len(job.specs)))
    return [
        replace(
            job,
            specs=job.specs[k::num_procs],
            texts=None if job.texts is None else job.texts[k::num_procs],
            concurrency=job.concurrency // num_procs + (k < job.concurrency % num_procs),
            id_prefix=f"{job.id_prefix}-p{k}",
            show_progress=job.show_progress and num_procs == 1,
        )
        for k in range(num_procs)
    ]


def _decoder(args: argparse.Namespace, model: ModelChoice) -> Callable[[list[int]], str]:
    """Token ids -> a text prompt that the router tokenizes to about as many tokens: decoded by the router's
    tokenizer (the synthetic one's words `t<i>` for a config-only shape)."""
    folder = Path(args.tokenizer).expanduser() if args.tokenizer else resolve_model(model.model)
    if not (folder / "tokenizer.json").is_file():
        if not args.tokenizer:
            return lambda token_ids: " ".join(f"t{t}" for t in token_ids)
        folder = resolve_model(args.tokenizer)
    from router.tokenizer.tokenizer_pool import load_tokenizer

    tokenizer = load_tokenizer(folder)
    return lambda token_ids: str(tokenizer.decode(token_ids, skip_special_tokens=True))


async def _tokenized(address: str, specs: Sequence[RequestSpec], texts: Sequence[str]) -> list[RequestSpec]:
    """The specs with the very token ids the router makes of their texts (the direct baseline sends those)."""
    async with RouterTarget(address, None) as router:
        ids = await asyncio.gather(*(router.tokenize(text) for text in texts))
    return [RequestSpec(token_ids, spec.max_tokens) for spec, token_ids in zip(specs, ids, strict=True)]


@contextlib.contextmanager
def _client_pool(num_procs: int) -> Iterator[Executor | None]:
    if num_procs <= 1:
        yield None
        return
    # NOTE: spawn, not fork: this process may hold CUDA state or threads that a fork must not copy. The clients die
    # with this process, however it ends.
    context = multiprocessing.get_context("spawn")
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(num_procs, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        # NOTE: an interrupted run (SIGINT, SIGTERM) yields no figures: its clients stop at once, cancelling their
        # requests, so that the cluster's pods have nothing left to drain.
        pool.shutdown(wait=False, cancel_futures=True)
        for client in set(multiprocessing.active_children()) - others:
            client.terminate()
        raise
    pool.shutdown()


def run_w8(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    with serving(args, model) as cluster:
        prefill, decode = pod_addresses(cluster.redis_url) if cluster.redis_url else ([], [])
        base = ClientJob(
            via_router=True,
            address=cluster.address,
            prefill_addresses=tuple(prefill),
            decode_addresses=tuple(decode),
            specs=(),
            texts=None,
            concurrency=1,
            num_connections=args.client_connections,
            timeout_s=args.request_timeout_s,
            id_prefix=f"{args.run_id}-w8",
            show_progress=args.progress,
        )
        to_text = _decoder(args, model) if args.prompt_format == "text" else None
        notes = [] if prefill and decode else ["no direct baseline: the pods' Redis is unknown (pass --redis-url)"]
        with _client_pool(args.client_procs) as pool:
            bench = _RouterBench(args, pool, base, asyncio.run(_vocab_size(cluster.address)), to_text)
            bench.warm_up()
            rows = [bench.level(concurrency, cluster.router_pid, cluster.pod_pids) for concurrency in levels]
    return {"levels": rows, "client_procs": args.client_procs, "notes": notes}


async def _vocab_size(address: str) -> int:
    async with RouterTarget(address, None) as router:
        return int((await router.model_info()).vocab_size)


@dataclass(frozen=True, slots=True)
class _RouterBench:
    args: argparse.Namespace
    pool: Executor | None
    base: ClientJob
    vocab_size: int
    to_text: Callable[[list[int]], str] | None
    """Text prompts (--prompt-format text): token ids -> text; None: prompts go as token ids."""

    def warm_up(self) -> None:
        """Warm both paths, and start the client processes before anything is measured."""
        num_requests = max(self.args.warmup_prompts, self.args.client_procs)
        job = replace(
            self.base,
            specs=tuple(self._specs(num_requests, "warmup")),
            concurrency=num_requests,
            id_prefix=f"{self.base.id_prefix}-warmup",
        )
        self._run(job)
        if job.prefill_addresses:
            self._run(replace(job, via_router=False, id_prefix=f"{job.id_prefix}-direct"))

    def level(self, concurrency: int, router_pid: int | None, pod_pids: Mapping[str, int]) -> dict[str, Any]:
        """One concurrency level: the direct run, then the router run (other prompts) with its CPU time and the
        pods'."""
        n = self.args.num_prompts or max(32, 8 * concurrency)
        row: dict[str, Any] = {"concurrency": concurrency, "requests": n}
        job = replace(self.base, concurrency=concurrency, id_prefix=f"{self.base.id_prefix}-c{concurrency}")
        router_specs, direct_specs = self._specs(n, f"{concurrency}-router"), self._specs(n, f"{concurrency}-direct")
        texts: tuple[str, ...] | None = None
        if self.to_text is not None:
            texts = tuple(self.to_text(spec.prompt_token_ids) for spec in router_specs)
            direct_texts = [self.to_text(spec.prompt_token_ids) for spec in direct_specs]
            direct_specs = asyncio.run(_tokenized(job.address, direct_specs, direct_texts))
        direct = None
        if job.prefill_addresses:
            direct, before, after = self._measured(replace(job, via_router=False, specs=tuple(direct_specs)))
            row["direct"] = summarize(direct) | self._cpu(direct, before, after, pod_pids)
        routed, before, after = self._measured(replace(job, specs=tuple(router_specs), texts=texts))
        row["router"] = summarize(routed) | self._cpu(routed, before, after, pod_pids)
        if router_pid is not None and routed.completed:
            cpu_s = after.tree(router_pid) - before.tree(router_pid)
            row["router_cpu_ms_per_request"] = cpu_s / len(routed.completed) * 1000
            row["streams_per_s_per_core"] = len(routed.completed) / cpu_s if cpu_s > 0 else None
            row["router_cpu_cores"] = cpu_s / routed.duration_s
        if direct is not None and direct.completed and routed.completed:
            row["overhead_ms"] = _overhead_ms(routed, direct)
        return row

    def _specs(self, num_requests: int, tag: str) -> list[RequestSpec]:
        args = self.args
        return fixed_requests(self.vocab_size, num_requests, args.input_len, args.output_len, f"{args.seed}-w8-{tag}")

    def _measured(self, job: ClientJob) -> tuple[RunResult, CpuSnapshot, CpuSnapshot]:
        """The run, and the CPU times of every process before and after it."""
        before = CpuSnapshot.take()
        result = self._run(job)
        return result, before, CpuSnapshot.take()

    def _cpu(
        self, result: RunResult, before: CpuSnapshot, after: CpuSnapshot, pod_pids: Mapping[str, int]
    ) -> dict[str, Any]:
        """Streams/s, and the CPU milliseconds per completed request of each pod (front, core) and of the clients."""
        out: dict[str, Any] = {"streams_per_s": len(result.completed) / result.duration_s}
        if result.completed:
            out["pod_cpu_ms_per_request"] = pod_cpu_ms_per_request(before, after, pod_pids, len(result.completed))
            clients = [p.pid for p in multiprocessing.active_children()] if self.pool else [os.getpid()]
            cpu_s = sum((after.own(pid) - before.own(pid) for pid in clients if pid is not None), 0.0)
            out["client_cpu_ms_per_request"] = cpu_s / len(result.completed) * 1000
        return out

    def _run(self, job: ClientJob) -> RunResult:
        if self.pool is None:
            return run_client(job)
        return merge(list(self.pool.map(run_client, split_job(job, self.args.client_procs))))


def _overhead_ms(routed: RunResult, direct: RunResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("ttft", "e2e"):
        values = [[getattr(r.timing, name) for r in run.completed] for run in (routed, direct)]
        out[f"{name}_p50"] = (statistics.median(values[0]) - statistics.median(values[1])) * 1000
        out[f"{name}_mean"] = (statistics.fmean(values[0]) - statistics.fmean(values[1])) * 1000
    return out
