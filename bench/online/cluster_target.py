"""The cluster an online benchmark talks to: an already running router (`--address`), or a `LocalCluster`
(Redis, pods and router as child processes) started for the run and stopped after it, also when the run is stopped
by SIGINT or SIGTERM (`cli.stop_signals`; SIGKILL takes the cluster along too: `common.child_process`).

Random-weight shapes (`--model-shape qwen3-8b`) run as `--model shape:qwen3-8b --load-format dummy` on every pod.
Their folder holds only config.json, so the router, which needs a tokenizer to detokenize, gets `--tokenizer`:
a word-level tokenizer written for the run whose token i is the word `t<i>`, covering the whole vocabulary
(prompts go in as token ids, so it only shapes the text the router streams back).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig, parse_gpus
from cli.stop_signals import stopping_on_signals
from common.pod_registry import PodRegistry
from engine.config import DEFAULT_MODEL
from engine.model_store import resolve_model
from engine.models.arch_config import ArchConfig
from engine.models.shapes import SHAPE_PREFIX

_REGISTRY_REFRESH_S = 0.5


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """The model every pod (and the colocated engine) runs."""

    model: str
    """--model of pods and router: an alias, a folder, or shape:NAME."""
    load_format: str
    """auto (the folder's weights) or dummy (random weights of a shape)."""


@dataclass(frozen=True, slots=True)
class Serving:
    """Where the benchmark finds the cluster."""

    address: str
    """host:port of the router."""
    redis_url: str | None
    """The cluster's Redis (pod registry), when known: needed to call the pods directly (W8)."""
    router_pid: int | None
    """The router's process id, when known: its CPU time gives W8's streams/s/core."""
    pod_pids: Mapping[str, int] = field(default_factory=dict)
    """Process ids of the pods by pod id (own cluster only): their CPU time per request in W8."""


def model_choice(args: argparse.Namespace) -> ModelChoice:
    if args.model_shape:
        return ModelChoice(SHAPE_PREFIX + args.model_shape, "dummy")
    return ModelChoice(args.model or DEFAULT_MODEL, "auto")


def pod_flags(args: argparse.Namespace, model: ModelChoice) -> list[str]:
    """Flags of every pod beyond the cluster's own: --load-format for shapes, then each --pod-arg (shell-split)."""
    flags = ["--load-format", model.load_format] if model.load_format != "auto" else []
    return flags + [flag for arg in args.pod_arg for flag in shlex.split(arg)]


def colocated_flags(args: argparse.Namespace, model: ModelChoice) -> list[str]:
    """The colocated engine's flags: the pods' engine flags, then each --colocated-arg (which win)."""
    return pod_flags(args, model) + [flag for arg in args.colocated_arg for flag in shlex.split(arg)]


def write_synthetic_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A word-level tokenizer of `vocab_size` tokens, token i being the word `t<i>`; returns `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    return folder


@contextlib.contextmanager
def serving(args: argparse.Namespace, model: ModelChoice) -> Iterator[Serving]:
    """The running router at --address, or a LocalCluster of --num-prefill + --num-decode pods for the run (call it
    from the main thread: SIGINT and SIGTERM raise KeyboardInterrupt while the cluster runs)."""
    if args.address:
        yield Serving(args.address, args.redis_url, args.router_pid)
        return
    with local_cluster(args, model) as cluster:
        router = cluster.router
        yield Serving(
            cluster.router_address,
            cluster.redis_url,
            router.pid if router is not None else None,
            {pod_id: pod.pid for pod_id, pod in cluster.pods.items()},
        )


@contextlib.contextmanager
def local_cluster(args: argparse.Namespace, model: ModelChoice) -> Iterator[LocalCluster]:
    """A LocalCluster of --num-prefill + --num-decode pods on --gpus, started for the run and stopped after it (also
    on SIGINT and SIGTERM, which raise KeyboardInterrupt meanwhile: call it from the main thread)."""
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-") as workdir:
        config = ClusterConfig(
            num_prefill=args.num_prefill,
            num_decode=args.num_decode,
            port=0,
            model=model.model,
            kv_transfer_backend=args.kv_transfer_backend,
            registry_refresh_s=_REGISTRY_REFRESH_S,
            pod_args=tuple(pod_flags(args, model)),
            router_args=tuple(_router_flags(args, model, Path(workdir))),
            log_dir=args.log_dir,
            startup_timeout_s=args.startup_timeout_s,
            show_progress=args.progress,
            metrics_port=None,
            gpus=parse_gpus(args.gpus or ""),
        )
        cluster = LocalCluster(config)
        with stopping_on_signals(cluster.stop):
            cluster.start()
            yield cluster


def _router_flags(args: argparse.Namespace, model: ModelChoice, workdir: Path) -> list[str]:
    if args.tokenizer:
        return ["--tokenizer", args.tokenizer]
    folder = resolve_model(model.model)
    if (folder / "tokenizer.json").is_file():
        return []
    vocab_size = ArchConfig.from_folder(folder).vocab_size
    return ["--tokenizer", str(write_synthetic_tokenizer(workdir / "tokenizer", vocab_size))]


def pod_addresses(redis_url: str) -> tuple[list[str], list[str]]:
    """(prefill, decode) gRPC addresses of the live, non-draining pods in the registry."""

    async def read() -> tuple[list[str], list[str]]:
        registry = PodRegistry(redis_url)
        try:
            pods = [pod for pod in await registry.list_pods() if not pod.draining]
        finally:
            await registry.aclose()
        return [p.address for p in pods if p.role == "prefill"], [p.address for p in pods if p.role == "decode"]

    return asyncio.run(read())
