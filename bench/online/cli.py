"""The online workloads of docs/workloads.md, through the router of a real cluster: W2-online, W5, W7-W9, W12.

`add_arguments(parser)` adds every flag they read (not --workload); `run(args)` runs `args.workload` (one of
`WORKLOADS`) and returns its figures as a JSON-able dict. Unless --address names a running router, the run
starts a LocalCluster (Redis, --num-prefill + --num-decode pods and the router as child processes) and stops
it at the end; workloads with a colocated baseline (w2online, w7) run this project's engine first, in a colocated
engine core process that ends before the cluster starts, so both fit on one GPU.

Prompts are random token ids (seeded by --seed, different for each phase and rate), sent as token ids, greedy,
EOS ignored, a fixed output length per request. Against a running cluster (--address), give each run a --seed
of its own: the same seed sends the same prompts, which the pods' prefix caches then already hold. Every figure
comes from client-side times of the streamed responses (first token = the first response carrying token ids);
see `bench.online.load_driver`.
"""

from __future__ import annotations

import argparse
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoscaler.config import AutoscalerConfig
from bench.online.autoscale_split import run_w12
from bench.online.cluster_target import ModelChoice, model_choice
from bench.online.goodput import run_w7
from bench.online.router_overhead import run_w8
from bench.online.runs import run_w2online, run_w5, run_w9
from common.config import add_config_args

WORKLOADS = ("w2online", "w5", "w7", "w8", "w9", "w12")
_PLAIN = (str, int, float, bool, list, type(None))

_DEFAULTS: dict[str, dict[str, Any]] = {
    "w2online": {"input_len": 2048, "output_len": 4, "num_prompts": 10},
    "w5": {"input_len": 200, "output_len": 180, "request_rates": "2,4,8,16,32", "duration_s": 15.0},
    "w7": {"input_len": 512, "output_len": 64, "request_rates": "2,4,8,16,32", "duration_s": 15.0},
    "w8": {"input_len": 128, "output_len": 32, "concurrency": "32,128"},
    "w9": {"input_len": 100, "output_len": 8, "num_prompts": 8},
    "w12": {"input_len": 4096, "output_len": 256, "duration_s": 120.0},
}
"""Per workload, the value of each flag left unset; W9's --input-len is the unique suffix after --prefix-len."""

_RUNNERS: dict[str, Callable[[argparse.Namespace, ModelChoice], dict[str, Any]]] = {
    "w2online": run_w2online,
    "w5": run_w5,
    "w7": run_w7,
    "w8": run_w8,
    "w9": run_w9,
    "w12": run_w12,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the online workloads (the caller adds --workload, one of WORKLOADS)."""
    _add_cluster_arguments(parser)
    _add_load_arguments(parser)
    slo = parser.add_argument_group("SLO (w7, w12)")
    slo.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO (default: 400 ms for inputs <= 1024, else 1500 ms)")
    slo.add_argument("--slo-tpot-ms", type=float, default=50.0, help="TPOT SLO, first token excluded (default: 50)")
    slo.add_argument("--slo-attainment", type=float, default=0.9, help="goodput target fraction (default: 0.9)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bars")
    _add_split_arguments(parser)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster (started for the run unless --address is given)")
    cluster.add_argument("--address", help="host:port of a running router; default: start a LocalCluster")
    model = cluster.add_mutually_exclusive_group()
    model.add_argument("--model", help="model folder or alias with real weights (default: smollm2-135m)")
    model.add_argument(
        "--model-shape",
        help="random weights of a named shape, e.g. qwen3-8b (pods: --load-format "
        "dummy; the router gets a synthetic tokenizer unless --tokenizer)",
    )
    cluster.add_argument("--tokenizer", help="the router's --tokenizer (default: the model's, else a synthetic one)")
    cluster.add_argument("--num-prefill", type=int, default=1, help="prefill pods (default: 1)")
    cluster.add_argument("--num-decode", type=int, default=1, help="decode pods (default: 1)")
    cluster.add_argument("--kv-transfer-backend", default="tcp", help="tcp, cuda_ipc, nccl, ... (default: tcp)")
    cluster.add_argument(
        "--pod-arg",
        action="append",
        default=[],
        metavar="FLAGS",
        help="flags for every pod and the colocated engine, shell-split; repeatable, e.g. "
        "--pod-arg '--num-blocks 4096' --pod-arg=--enforce-eager",
    )
    cluster.add_argument(
        "--colocated-arg",
        action="append",
        default=[],
        metavar="FLAGS",
        help="flags of the colocated engine only, after the pods' ('--num-blocks 2048')",
    )
    cluster.add_argument("--redis-url", help="with --address: the cluster's Redis, to call pods directly (w8)")
    cluster.add_argument("--router-pid", type=int, help="with --address: the router's pid, for its CPU time (w8)")
    cluster.add_argument(
        "--gpus",
        help="GPU ids to spread the LocalCluster's pods over, one per GPU where they fit "
        "(prefill pods, then decode pods; as `pdserve up --gpus`); default: the pods inherit "
        "CUDA_VISIBLE_DEVICES (all on its first GPU)",
    )
    cluster.add_argument(
        "--cluster-gpus",
        type=int,
        help="GPUs the cluster counts as in per-GPU figures (w7; default: the GPUs the --gpus layout uses, else 1)",
    )
    cluster.add_argument(
        "--dry-run",
        action="store_true",
        help="w7: print where each system runs and the GPUs its per-GPU figures divide by; run nothing",
    )
    cluster.add_argument("--log-dir", type=Path, help="the cluster's process logs (default: a temp folder)")
    cluster.add_argument("--startup-timeout-s", type=float, default=600.0)


def _add_load_arguments(parser: argparse.ArgumentParser) -> None:
    load = parser.add_argument_group(
        "load",
        "unset lengths and counts take the workload's defaults: --input-len/--output-len w2online 2048/4, "
        "w5 200/180 (means), w7 512/64, w8 128/32, w9 100/8 (after --prefix-len); --num-prompts w2online 10, w9 8",
    )
    load.add_argument("--seed", type=int, default=0, help="seed of prompts, lengths and arrivals (default: 0)")
    load.add_argument("--input-len", type=int, help="prompt tokens (w5: the mean; w9: the unique suffix)")
    load.add_argument("--output-len", type=int, help="output tokens per request (w5: the mean)")
    load.add_argument(
        "--num-prompts",
        type=int,
        help="requests per phase (w5, w7: per rate, default rate x --duration-s, at least 10; "
        "w8: per concurrency, default 8 x concurrency)",
    )
    load.add_argument("--request-rates", help="Poisson rates in req/s, comma-separated (w5, w7; default 2,4,8,16,32)")
    load.add_argument(
        "--duration-s", type=float, help="arrival span per rate (w5, w7; default: 15), of the steady load (w12: 120)"
    )
    load.add_argument(
        "--stop-at-saturation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end a rate sweep after a rate served at < half its rate (w5) or with SLO attainment "
        "< half the target (w7)",
    )
    load.add_argument("--warmup-prompts", type=int, default=4, help="requests sent before measuring (default: 4)")
    load.add_argument("--request-timeout-s", type=float, default=300.0, help="deadline of each request (default: 300)")
    load.add_argument("--concurrency", help="w8: concurrent streams, comma-separated (default: 32,128)")
    load.add_argument(
        "--client-connections",
        type=int,
        default=4,
        help="w8: connections each client process opens to the router, used in turn (default: 4)",
    )
    load.add_argument(
        "--client-procs",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 1) // 4)),
        help="w8: client processes sharing the streams (default: cores / 4, at most 4)",
    )
    load.add_argument(
        "--prompt-format",
        choices=("text", "token_ids"),
        default="text",
        help="w8: prompts as text (the router tokenizes them) or token ids (default: text)",
    )
    load.add_argument("--prefix-len", type=int, default=2048, help="w9: shared system prompt tokens (default: 2048)")


def _add_split_arguments(parser: argparse.ArgumentParser) -> None:
    split = parser.add_argument_group(
        "w12 autoscale split",
        "a steady load on --gpus; the autoscaler (its AutoscalerConfig flags below) moves GPUs between roles, "
        "or --split holds a fixed one",
    )
    split.add_argument("--split", help="PREFILL:DECODE pods held fixed, no autoscaler (e.g. 2:2); default: autoscale")
    split.add_argument("--request-rate", type=float, default=8.0, help="Poisson arrivals in req/s (default: 8)")
    split.add_argument(
        "--sample-interval-s", type=float, default=5.0, help="seconds between two timeline rows (default: 5)"
    )
    split.add_argument(
        "--final-fraction",
        type=float,
        default=1 / 3,
        help="the last part of the arrival span the final figures judge (default: the last third)",
    )
    split.add_argument(
        "--ttft-queue-fraction",
        type=float,
        default=0.5,
        help="--prefill-queue-high-s, unless given, is this fraction of --slo-ttft-ms (default: 0.5)",
    )
    split.add_argument(
        "--out-dir", help="timeline.csv, timeline.svg, w12.json (default: ./w12-autoscale, ./w12-fixed-P-D)"
    )
    add_config_args(parser, AutoscalerConfig)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run `args.workload` and return its figures (JSON-able: NaN becomes None)."""
    if args.workload not in _RUNNERS:
        raise ValueError(f"unknown online workload {args.workload!r}; choose one of {', '.join(WORKLOADS)}")
    args = with_defaults(args)
    model = model_choice(args)
    result: dict[str, Any] = {
        "workload": args.workload,
        "model": model.model,
        "cluster": args.address or f"{args.num_prefill} prefill + {args.num_decode} decode, LocalCluster",
        "kv_transfer_backend": None if args.address else args.kv_transfer_backend,
        "args": {k: v if isinstance(v, _PLAIN) else str(v) for k, v in sorted(vars(args).items())},
    }
    result |= _RUNNERS[args.workload](args, model)
    return _json_safe(result)


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """A copy of `args` with the workload's defaults filled in, plus `run_id` (a prefix of request ids)."""
    values = vars(args).copy()
    for name, value in _DEFAULTS[args.workload].items():
        if values.get(name) is None:
            values[name] = value
    if values.get("slo_ttft_ms") is None:
        values["slo_ttft_ms"] = 400.0 if values["input_len"] <= 1024 else 1500.0
    values.setdefault("run_id", uuid.uuid4().hex[:8])
    return argparse.Namespace(**values)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
