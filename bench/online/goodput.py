"""W7 pd-goodput: requests/s per GPU at --slo-attainment (90%) SLO attainment, colocated vs disaggregated.

Both systems get the same requests (--input-len / --output-len, 512/64 or 4096/256) on the same Poisson
arrivals at each --request-rates rate. A request attains the SLO when its TTFT <= --slo-ttft-ms and its TPOT
(first token excluded) <= --slo-tpot-ms; a failed request does not. A system's goodput is the highest swept
rate whose attainment reaches the target (also given interpolated to where attainment crosses the target),
divided by the GPUs it uses: 1 for the colocated engine; for the cluster --cluster-gpus, by default the GPUs its
--gpus layout uses (else 1: without --gpus a LocalCluster's pods all run on the same device).

"colocated" is this project's engine with no disaggregation (chunked prefill mixes prefills into the decode
batches), in an engine core process of its own (`bench.online.colocated`), run first and stopped; "disaggregated" is the
cluster, through its router.

Like with like on two GPUs (`pdserve bench --workload w7 --gpus 0,1`, started with CUDA_VISIBLE_DEVICES=0 so the
colocated engine runs on GPU 0): 1 prefill + 1 decode, one pod per GPU (`ClusterConfig.gpu_layout`), against two
colocated engines, one per GPU. Those two serve independent halves of the load, so their per-GPU goodput is one
engine's on one GPU: one engine is measured, divided by 1 GPU, while the cluster's is divided by its 2.
`--dry-run` prints that plan (`w7_plan`) without running anything.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, Any

from bench.online.cluster_target import ModelChoice, serving
from bench.online.load_driver import RunResult
from bench.online.runs import Generate, router_target, sweep_rates, warm_up, with_colocated
from bench.reporting.stats import max_rate_meeting, slo_attainment
from bench.workloads import RequestSpec, fixed_requests
from cli.cluster_config import ClusterConfig, parse_gpus

if TYPE_CHECKING:
    from bench.online.colocated import ColocatedTarget

_GIVE_UP_FRACTION = 0.5
"""A sweep ends after a rate whose attainment is below this fraction of the target."""


def w7_plan(args: argparse.Namespace) -> dict[str, Any]:
    """Where each system runs and the GPUs its per-GPU figures divide by; raises InvalidArgumentError for --gpus."""
    layout: dict[str, str] = {}
    if not args.address:
        pods = ClusterConfig(num_prefill=args.num_prefill, num_decode=args.num_decode, gpus=parse_gpus(args.gpus or ""))
        layout = pods.gpu_layout()
    cluster_gpus = args.cluster_gpus if args.cluster_gpus is not None else len(set(layout.values())) or 1
    return {
        "colocated": {"engines": 1, "gpus": 1, "device": "cuda:0 of the benchmark's environment"},
        "disaggregated": {"cluster": args.address or "LocalCluster", "gpus": cluster_gpus, "pod_gpus": layout},
    }


def run_w7(args: argparse.Namespace, model: ModelChoice) -> dict[str, Any]:
    plan = w7_plan(args)
    if args.dry_run:
        return {"plan": plan}
    ttft_slo_s, tpot_slo_s = args.slo_ttft_ms / 1000, args.slo_tpot_ms / 1000

    def judge(rate: float, result: RunResult) -> dict[str, Any]:
        attainment = slo_attainment([r.timing for r in result.completed], result.num_failed, ttft_slo_s, tpot_slo_s)
        return {"slo_attainment": attainment, "saturated": not attainment >= _GIVE_UP_FRACTION * args.slo_attainment}

    async def sweep(name: str, generate: Generate, vocab_size: int) -> list[dict[str, Any]]:
        await warm_up(args, generate, vocab_size, args.input_len)

        def make_specs(rate: float, n: int) -> list[RequestSpec]:
            return fixed_requests(vocab_size, n, args.input_len, args.output_len, f"{args.seed}-w7-{rate}")

        return await sweep_rates(args, name, generate, make_specs, judge)

    async def colocated(target: ColocatedTarget) -> tuple[int, list[dict[str, Any]]]:
        return target.info.vocab_size, await sweep("colocated", target.generate, target.info.vocab_size)

    vocab_size, colocated_rows = with_colocated(args, model, colocated)

    async def disaggregated(address: str) -> list[dict[str, Any]]:
        async with router_target(args, address) as target:
            return await sweep("disaggregated", target.generate, vocab_size)

    with serving(args, model) as cluster:
        disaggregated_rows = asyncio.run(disaggregated(cluster.address))
    systems = {
        name: _system(rows, plan[name]["gpus"], args.slo_attainment)
        for name, rows in (("colocated", colocated_rows), ("disaggregated", disaggregated_rows))
    }
    per_gpu = [systems[name]["goodput_req_per_s_per_gpu"] for name in ("disaggregated", "colocated")]
    return {
        "plan": plan,
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "attainment": args.slo_attainment},
        **systems,
        "goodput_per_gpu_ratio": per_gpu[0] / per_gpu[1] if None not in per_gpu and per_gpu[1] else None,
    }


def _system(rows: list[dict[str, Any]], num_gpus: int, target: float) -> dict[str, Any]:
    rates = [row["offered_req_per_s"] for row in rows]
    goodput = max_rate_meeting(rates, [row["slo_attainment"] for row in rows], target)
    max_rate, crossing = goodput["max_rate"], goodput["interpolated_rate"]
    return {
        "gpus": num_gpus,
        "goodput_req_per_s": max_rate,
        "goodput_req_per_s_per_gpu": None if max_rate is None else max_rate / num_gpus,
        "interpolated_goodput_req_per_s_per_gpu": None if crossing is None else crossing / num_gpus,
        "rates": rows,
    }
