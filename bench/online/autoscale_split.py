"""W12 autoscale split: a steady load on a fixed set of GPUs, the prefill:decode split chosen by the autoscaler (or
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
5. The autoscaler stops. The timeline (bench/online/split_timeline.py) and the figures of the last
   --final-fraction of the run are written to --out-dir (bench/online/split_output.py), also when the load was cut
   short (then marked `interrupted`), and the cluster stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoscaler.config import AutoscalerConfig
from autoscaler.run import start_for_cluster
from autoscaler.service import Autoscaler
from bench.online.arrivals import poisson_arrivals
from bench.online.cluster_target import ModelChoice, local_cluster
from bench.online.load_driver import RequestRecord, RunResult, Send, run_poisson
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


@dataclass(slots=True)
class Observed:
    """What the steady load has seen so far (also when it is stopped early); times are seconds since `load_start`."""

    load_start: float
    samples: list[PodSample] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    send_lags_s: list[float] = field(default_factory=list)

    def run_result(self) -> RunResult:
        """The ended requests as one run (from the load's start to the last end)."""
        end_s = max((f.end_s for f in self.finished), default=0.0)
        return RunResult([f.record for f in self.finished], end_s, self.load_start, self.send_lags_s)


class ClusterSampler:
    """Samples the cluster (`PodSample`) into `observed.samples` every `interval_s` until stopped."""

    def __init__(self, cluster: LocalCluster, observed: Observed) -> None:
        self._cluster = cluster
        self._observed = observed

    async def sample(self, registry: PodRegistry) -> None:
        """Append the cluster's state now; a registry read that fails appends nothing (logged)."""
        try:
            pods = await registry.list_pods()
        except UnavailableError as exc:
            logger.warning("w12: no timeline sample, the registry is unavailable: %s", exc)
            return
        active = [p for p in pods if not p.draining]
        decode = [p for p in active if p.role == "decode"]
        registered = {p.pod_id for p in pods}
        self._observed.samples.append(
            PodSample(
                t_s=time.monotonic() - self._observed.load_start,
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


def _stamping(send: Send, observed: Observed) -> Send:
    """`send`, keeping each request's record with its end time in `observed.finished`."""

    async def send_stamped(i: int) -> RequestRecord:
        record = await send(i)
        observed.finished.append(FinishedRequest(time.monotonic() - observed.load_start, record))
        return record

    return send_stamped


async def _steady_load(args: argparse.Namespace, cluster: LocalCluster, on_load_start: Callable[[], Observed]) -> None:
    """Steps 2 and 4 of the module docstring; `on_load_start()` starts the autoscaler and returns where to keep
    what the load sees."""
    async with router_target(args, cluster.router_address) as target:
        vocab_size = (await target.model_info()).vocab_size
        await warm_up(args, target.generate, vocab_size, args.input_len)
        num_requests = max(1, round(args.request_rate * args.duration_s))
        specs = fixed_requests(vocab_size, num_requests, args.input_len, args.output_len, f"{args.seed}-w12")
        arrivals = poisson_arrivals(args.request_rate, num_requests, f"{args.seed}-w12-arrivals")
        observed = on_load_start()
        stop = asyncio.Event()
        sampling = asyncio.create_task(ClusterSampler(cluster, observed).run(args.sample_interval_s, stop))
        try:
            send = _stamping(sender(target.generate, specs, f"{args.run_id}-w12"), observed)
            result = await run_poisson(send, arrivals, f"w12 {args.request_rate:g} req/s", args.progress)
            observed.send_lags_s = result.send_lags_s
        finally:
            stop.set()
            await sampling


def _check(args: argparse.Namespace) -> None:
    if args.address:
        raise InvalidArgumentError("address", "w12 starts a cluster of its own (the autoscaler acts on its pods)")
    if not 0 < args.final_fraction <= 1:
        raise InvalidArgumentError("final_fraction", f"must be in (0, 1], got {args.final_fraction}")
    if args.sample_interval_s <= 0:
        raise InvalidArgumentError("sample_interval_s", f"must be > 0, got {args.sample_interval_s}")


def run_w12(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    """The run of the module docstring. The files are written before the cluster stops, also when the load is cut
    short (SIGINT, SIGTERM or an error: then `interrupted` is true in w12.json and the exception goes on)."""
    _check(args)
    split = parse_split(args.split)
    config = None if split is not None else autoscaler_config(args, len(parse_gpus(args.gpus or "")))
    prefill, decode = split or (1, 1)
    run_args = argparse.Namespace(**{**vars(args), "num_prefill": prefill, "num_decode": decode})
    autoscaler: Autoscaler | None = None
    observed: Observed | None = None

    def start_load() -> Observed:
        nonlocal autoscaler, observed
        if config is not None:
            autoscaler, _ = start_for_cluster(config, cluster)
        observed = Observed(time.monotonic())
        return observed

    with local_cluster(run_args, model) as cluster:
        interrupted = True
        try:
            asyncio.run(_steady_load(args, cluster, start_load))
            interrupted = False
        finally:
            if autoscaler is not None:
                autoscaler.stop_thread()
            if observed is not None:
                result = _result(args, config, observed)
                result["interrupted"] = interrupted
                result["files"] = _write(args, model, result)
    return result


def _result(args: argparse.Namespace, config: AutoscalerConfig | None, observed: Observed) -> dict[str, Any]:
    slo = Slo(args.slo_ttft_ms / 1000, args.slo_tpot_ms / 1000, args.slo_attainment)
    samples, finished = observed.samples, observed.finished
    split = parse_split(args.split)
    prefill, decode = split or (1, 1)
    return {
        "mode": f"fixed {prefill}:{decode}" if split else "autoscale",
        "cluster": f"LocalCluster, {prefill} prefill + {decode} decode at the start",
        "gpus": args.gpus,
        "request_rate": args.request_rate,
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "attainment": args.slo_attainment},
        "autoscaler": None if config is None else asdict(config),
        "whole_run": summarize_run(observed.run_result()),
        "final": final_part(samples, finished, observed.load_start, args.duration_s, args.final_fraction, slo),
        "split_changes": split_changes(samples),
        "timeline": timeline_rows(samples, finished, slo),
    }


def _write(args: argparse.Namespace, model: ModelChoice, result: dict[str, Any]) -> dict[str, str]:
    default = "w12-" + ("fixed-" + args.split.replace(":", "-") if args.split else "autoscale")
    note = f"{model.model} {args.input_len}/{args.output_len} at {args.request_rate:g} req/s on GPUs {args.gpus}"
    return write_outputs(Path(args.out_dir or default), result["mode"], result, note)
