"""What a local pdserve cluster starts: `ClusterConfig`, the roles and the command each role runs.

Telemetry: every process serves Prometheus /metrics (`--metrics-port`): the router on `metrics_port`, the
first prefill pod on `metrics_port + 1`, the first decode pod on `metrics_port + 2`, further pods on free
ports (all on free ports with `metrics_port=0`; none with None); `otlp_endpoint` goes to every process.

GPUs (`pdserve up --gpus`): the pods are spread over `gpus` through each pod process's CUDA_VISIBLE_DEVICES. The
rule: the pods in start order (the prefill pods, then the decode pods, then any pod added later) each take the GPU
that the fewest live pods hold (a draining pod holds its GPU until it exits), the first of equals: round-robin while
no pod leaves. A pod's CUDA_VISIBLE_DEVICES lists its GPU first (its `cuda:0`, where the engine runs), followed by
the others in turn (`--gpus 0,1`: prefill-0 gets "0,1", decode-0 "1,0"). NOTE: the other
GPUs stay visible because the cuda_ipc backend maps the prefill pool of a pod on another GPU (peer access), which
CUDA allows only for a visible device. So with at least as many GPUs as pods each pod has a GPU of
its own (1 prefill + 1 decode on 0,1: prefill-0 on 0, decode-0 on 1), and with fewer the pods share them evenly
(2 + 2 on 0,1: prefill-0 and decode-0 on 0, prefill-1 and decode-1 on 1). With no GPUs (a CPU host) the pods
inherit CUDA_VISIBLE_DEVICES as it is. The router uses no GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cli.credentials import ClusterCredentials
from common.errors import InvalidArgumentError
from engine.config import DEFAULT_MODEL

Role = Literal["router", "prefill", "decode"]

ENTRY_POINTS: Mapping[Role, tuple[str, ...]] = {
    "router": (sys.executable, "-m", "router"),
    "prefill": (sys.executable, "-m", "prefill_service"),
    "decode": (sys.executable, "-m", "decode_service"),
}
"""The command that starts each role; its flags follow (see the service conventions)."""

DEFAULT_METRICS_PORT = 9100
METRICS_PORT_OFFSETS: Mapping[Role, int] = {"router": 0, "prefill": 1, "decode": 2}
"""Where the first process of each role serves /metrics, relative to `ClusterConfig.metrics_port`."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What `LocalCluster` starts and how."""

    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    port: int = 50051
    """The router's port; 0 picks a free one."""
    http_port: int = 0
    """The router's OpenAI-compatible HTTP port (its --http-port); 0: off (`pdserve up` serves 8000)."""
    redis_url: str | None = None
    """An existing Redis; None starts a throwaway redis-server (stopped with the cluster)."""
    model: str = DEFAULT_MODEL
    kv_transfer_backend: str = "tcp"
    registry_refresh_s: float = 1.0
    """How often the router re-reads the pod registry (its --registry-refresh-s)."""
    pod_args: tuple[str, ...] = ()
    """Extra flags for every pod (engine flags such as --num-blocks, --heartbeat-s)."""
    router_args: tuple[str, ...] = ()
    """Extra flags for the router."""
    router_workers: int | None = None
    """Processes serving the router's port (its --workers); None: the router's default (PDSERVE_ROUTER_WORKERS, else
    from the cores)."""
    log_dir: Path | None = None
    """Where each process writes `<name>.log`; None: a new temporary folder."""
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 35.0
    """How long a SIGTERMed process may take (pods drain in-flight requests) before it is killed."""
    show_progress: bool = False
    """A tqdm bar on stderr while the processes load."""
    metrics_port: int | None = DEFAULT_METRICS_PORT
    """The router's /metrics port; the first prefill and decode pods use the next two (see the module
    docstring); 0: free ports for every process; None: no /metrics endpoints."""
    otlp_endpoint: str | None = None
    """OTLP collector every process sends its spans to (their --otlp-endpoint); None: tracing off."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables of every process (e.g. OTEL_BSP_SCHEDULE_DELAY)."""
    entry_points: Mapping[Role, tuple[str, ...]] = field(default_factory=lambda: dict(ENTRY_POINTS))
    gpus: tuple[str, ...] = ()
    """GPU ids (CUDA_VISIBLE_DEVICES values: indices or GPU-/MIG- UUIDs) the pods are spread over (see the module
    docstring); empty: CUDA_VISIBLE_DEVICES is left as it is."""
    credentials: ClusterCredentials | None = None
    """Secure cluster (`pdserve up --secure`): bearer tokens and TLS on the router's port, mutual TLS between the
    router and pods and on the KV sockets, and (for its own redis-server) a Redis password and TLS; None: all off."""

    def __post_init__(self) -> None:
        for name in ("num_prefill", "num_decode"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.router_workers is not None and self.router_workers < 0:
            raise InvalidArgumentError("router_workers", f"must be >= 0, got {self.router_workers}")
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) < 1 << 16:
                raise InvalidArgumentError(name, f"must be in [0, 65535], got {getattr(self, name)}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < (1 << 16) - 2:
            raise InvalidArgumentError("metrics_port", f"must be in [0, 65533], got {self.metrics_port}")
        _check_gpu_ids(self.gpus)

    def next_gpu(self, taken: Sequence[int]) -> int | None:
        """Index into `gpus` of the next pod's GPU: the one fewest live pods hold (`taken`: the GPU index of each),
        the first of equals; None without `gpus`. While no pod leaves this is round-robin."""
        if not self.gpus:
            return None
        return min(range(len(self.gpus)), key=lambda index: (taken.count(index), index))

    def visible_devices(self, gpu: int) -> str:
        """The CUDA_VISIBLE_DEVICES of a pod on `gpus[gpu]`: that GPU first, then the others in turn."""
        return ",".join(self.gpus[gpu:] + self.gpus[:gpu])

    def gpu_layout(self) -> dict[str, str]:
        """The GPU of each pod `LocalCluster.start` starts, by pod id; empty without `gpus`."""
        pod_ids = [f"prefill-{i}" for i in range(self.num_prefill)] + [f"decode-{i}" for i in range(self.num_decode)]
        taken: list[int] = []
        for _ in pod_ids:
            gpu = self.next_gpu(taken)
            if gpu is None:
                return {}
            taken.append(gpu)
        return {pod_id: self.gpus[gpu] for pod_id, gpu in zip(pod_ids, taken, strict=True)}


_GPU_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")


def _check_gpu_ids(gpus: tuple[str, ...]) -> None:
    bad = [gpu for gpu in gpus if not _GPU_ID.fullmatch(gpu)]
    if bad:
        raise InvalidArgumentError("gpus", f"not GPU ids (indices or GPU-/MIG- UUIDs): {', '.join(map(repr, bad))}")
    if len(set(gpus)) != len(gpus):
        raise InvalidArgumentError("gpus", f"a GPU is named twice: {','.join(gpus)}")


def parse_gpus(text: str) -> tuple[str, ...]:
    """`--gpus 0,1,...` as ids (checked as `ClusterConfig` does); '' or 'none' is no GPU."""
    gpus = () if text.strip().lower() in ("", "none") else tuple(gpu.strip() for gpu in text.split(","))
    _check_gpu_ids(gpus)
    return gpus


def visible_gpus(environ: Mapping[str, str], nvidia_smi: str | None = None) -> tuple[str, ...]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the indices `nvidia-smi` lists (found
    on PATH unless given), else none (a CPU host)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return tuple(gpu.strip() for gpu in environ["CUDA_VISIBLE_DEVICES"].split(",") if gpu.strip() not in ("", "-1"))
    command = nvidia_smi or shutil.which("nvidia-smi")
    if command is None:
        return ()
    try:
        listing = subprocess.run(
            [command, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in listing.splitlines() if line.strip())
