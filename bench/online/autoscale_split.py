"""W11 autoscale split: a steady load on a fixed set of GPUs, the prefill:decode split chosen by the autoscaler (or
held fixed, for comparison), and the timeline of what happened.

The run, in order:
1. A LocalCluster on --gpus (always one of the run's own: the autoscaler's local connector needs its pod processes):
   1 prefill + 1 decode pod, or the pods of --split P:D.
2. --warmup-prompts requests.
3. Without --split, the autoscaler starts (`autoscaler.run.start_for_cluster`, the local connector) with the
   `AutoscalerConfig` flags, where the SLOs set three fields unless their own flags are given:
   `decode_tpot_slo_ms` = --slo-tpot-ms, `prefill_queue_high_s` = --ttft-queue-fraction x --slo-ttft-ms, and
   `max_total_pods` = the number of --gpus (one pod per GPU).
4. The steady load: Poisson arrivals at --request-rate for --duration-s, each request --input-len prompt tokens
   (random ids, none shared) asking for --output-len tokens; meanwhile the cluster is sampled every
   --sample-interval-s (the registry's pods, the GPUs the pod processes hold), and once more when every request
   has ended.
5. The autoscaler stops, then the cluster. The timeline (bench/online/split_timeline.py) and the figures of the
   last --final-fraction of the run are written to --out-dir (bench/online/split_output.py) and returned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoscaler.config import AutoscalerConfig
from autoscaler.run import start_for_cluster
from autoscaler.service import Autoscaler
from bench.online.arrivals import poisson_arrivals
from bench.online.cluster_target import ModelChoice, local_cluster
from bench.online.load_driver import RequestRecord, Send, run_poisson
from bench.online.load_driver import summarize as summarize_run
from bench.online.runs import router_target, sender, warm_up
from bench.online.split_output import write_outputs
from bench.online.split_timeline import FinishedRequest, PodSample, Slo, final_part, split_changes, timeline_rows
from bench.workloads import fixed_requests
from cli.cluster import LocalCluster
from cli.cluster_config import parse_gpus
from common.config import config_from_args
from common.errors import InvalidArgumentError, UnavailableError
from common.pod_registry import PodRegistry

logger = logging.getLogger(__name__)


def parse_split(text: str | None) -> tuple[int, int] | None:
    """`--split P:D` as (P, D), both >= 1; None (no --split: the autoscaler chooses)."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
        raise InvalidArgumentError("split", f"expected PREFILL:DECODE pod counts >= 1 such as 2:2, got {text!r}")
    return int(parts[0]), int(parts[1])


def autoscaler_config(args: argparse.Namespace, num_gpus: int) -> AutoscalerConfig:
    """The `AutoscalerConfig` flags, with the SLO-derived fields of the module docstring where their flags are unset."""
    derived = {
        "decode_tpot_slo_ms": args.slo_tpot_ms,
        "prefill_queue_high_s": args.ttft_queue_fraction * args.slo_ttft_ms / 1000,
        "max_total_pods": num_gpus,
    }
    return config_from_args(AutoscalerConfig, args, **{k: v for k, v in derived.items() if not hasattr(args, k)})


class ClusterSampler:
    """Samples the cluster (`PodSample`) every `interval_s` until stopped; times are seconds since `load_start`."""

    def __init__(self, cluster: LocalCluster, load_start: float) -> None:
        self._cluster = cluster
        self._load_start = load_start
        self.samples: list[PodSample] = []

    async def sample(self, registry: PodRegistry) -> None:
        """Append the cluster's state now; a registry read that fails appends nothing (logged)."""
        try:
            pods = await registry.list_pods()
        except UnavailableError as exc:
            logger.warning("w11: no timeline sample, the registry is unavailable: %s", exc)
            return
        active = [p for p in pods if not p.draining]
        decode = [p for p in active if p.role == "decode"]
        registered = {p.pod_id for p in pods}
        self.samples.append(
            PodSample(
                t_s=time.monotonic() - self._load_start,
                prefill_pods=sum(p.role == "prefill" for p in active),
                decode_pods=len(decode),
                draining_pods=len(pods) - len(active),
                starting_pods=sum(pod_id not in registered for pod_id in list(self._cluster.pods)),
                gpus_used=len(self._cluster.gpus_held()),
                prefill_queued_tokens=sum(p.queued_prompt_tokens or 0 for p in active if p.role == "prefill"),
                decode_step_ms=sum(p.step_ms for p in decode) / len(decode) if decode else 0.0,
            )
        )

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """A sample now and every `interval_s` until `stop` is set, then a last one."""
        registry = PodRegistry(self._cluster.redis_url)
        try:
            while not stop.is_set():
                await self.sample(registry)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
            await self.sample(registry)
        finally:
            await registry.aclose()


def _stamping(send: Send, finished: list[FinishedRequest], load_start: float) -> Send:
    """`send`, keeping each request's end time (seconds since `load_start`) with its record."""

    async def send_stamped(i: int) -> RequestRecord:
        record = await send(i)
        finished.append(FinishedRequest(time.monotonic() - load_start, record))
        return record

    return send_stamped


async def _steady_load(
    args: argparse.Namespace, cluster: LocalCluster, on_load_start: Callable[[], None]
) -> tuple[ClusterSampler, list[FinishedRequest], dict[str, Any], float]:
    """Steps 2 and 4 of the module docstring; (the samples, the ended requests, their summary, the load's start)."""
    async with router_target(args, cluster.router_address) as target:
        vocab_size = (await target.model_info()).vocab_size
        await warm_up(args, target.generate, vocab_size, args.input_len)
        num_requests = max(1, round(args.request_rate * args.duration_s))
        specs = fixed_requests(vocab_size, num_requests, args.input_len, args.output_len, f"{args.seed}-w11")
        arrivals = poisson_arrivals(args.request_rate, num_requests, f"{args.seed}-w11-arrivals")
        on_load_start()
        load_start = time.monotonic()
        finished: list[FinishedRequest] = []
        sampler, stop = ClusterSampler(cluster, load_start), asyncio.Event()
        sampling = asyncio.create_task(sampler.run(args.sample_interval_s, stop))
        try:
            send = _stamping(sender(target.generate, specs, f"{args.run_id}-w11"), finished, load_start)
            result = await run_poisson(send, arrivals, f"w11 {args.request_rate:g} req/s", args.progress)
        finally:
            stop.set()
            await sampling
    return sampler, finished, summarize_run(result), load_start


def _check(args: argparse.Namespace) -> None:
    if args.address:
        raise InvalidArgumentError("address", "w11 starts a cluster of its own (the autoscaler acts on its pods)")
    if not 0 < args.final_fraction <= 1:
        raise InvalidArgumentError("final_fraction", f"must be in (0, 1], got {args.final_fraction}")
    if args.sample_interval_s <= 0:
        raise InvalidArgumentError("sample_interval_s", f"must be > 0, got {args.sample_interval_s}")


def run_w11(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    _check(args)
    split = parse_split(args.split)
    num_gpus = len(parse_gpus(args.gpus or ""))
    config = None if split is not None else autoscaler_config(args, num_gpus)
    prefill, decode = split or (1, 1)
    run_args = argparse.Namespace(**{**vars(args), "num_prefill": prefill, "num_decode": decode})
    autoscaler: Autoscaler | None = None

    def start_autoscaler() -> None:
        nonlocal autoscaler
        if config is not None:
            autoscaler, _ = start_for_cluster(config, cluster)

    with local_cluster(run_args, model) as cluster:
        try:
            sampler, finished, summary, load_start = asyncio.run(_steady_load(args, cluster, start_autoscaler))
        finally:
            if autoscaler is not None:
                autoscaler.stop_thread()
    slo = Slo(args.slo_ttft_ms / 1000, args.slo_tpot_ms / 1000, args.slo_attainment)
    samples = sampler.samples
    name = f"fixed {prefill}:{decode}" if split else "autoscale"
    result: dict[str, Any] = {
        "mode": name,
        "cluster": f"LocalCluster, {prefill} prefill + {decode} decode at the start",
        "gpus": args.gpus,
        "request_rate": args.request_rate,
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "attainment": args.slo_attainment},
        "autoscaler": None if config is None else dataclasses.asdict(config),
        "whole_run": summary,
        "final": final_part(samples, finished, load_start, args.duration_s, args.final_fraction, slo),
        "split_changes": split_changes(samples),
    }
    rows = timeline_rows(samples, finished, slo)
    out_dir = Path(args.out_dir or f"w11-{'fixed-' + args.split.replace(':', '-') if split else 'autoscale'}")
    note = f"{model.model} {args.input_len}/{args.output_len} at {args.request_rate:g} req/s on GPUs {args.gpus}"
    result["files"] = write_outputs(out_dir, name, rows, result, note)
    return result
