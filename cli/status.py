"""`pdserve status`: every pod in the Redis pod registry, and the health of the routers named, as a table or JSON.

Pods come from the registry (`PodRegistry.list_pods`): their state and load are what their last heartbeat
said. Routers do not register; the caller names them (`--router ADDRESS`) and each gets one grpc.health.v1
Check (`cli.health`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

from cli.health import DEFAULT_TIMEOUT_S, check_health
from common.pod_registry import PodInfo, PodRegistry
from common.tls import ChannelSecurity

_POD_HEADER = ("POD", "ROLE", "STATE", "ADDRESS", "RUNNING", "WAITING", "FREE/TOTAL BLOCKS", "KV USED")
_POD_RIGHT_ALIGNED = frozenset({4, 5, 6, 7})
_COLUMN_GAP = "  "


@dataclass(frozen=True, slots=True)
class RouterStatus:
    """A router named on the command line, and what its health service said."""

    address: str
    state: str
    """The router's overall grpc.health.v1 status in lower case: serving, not_serving, unknown or unreachable."""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What `pdserve status` shows: the registry's pods (sorted by pod id) and the routers, in the order named."""

    pods: tuple[PodInfo, ...]
    routers: tuple[RouterStatus, ...]


async def read_status(
    redis_url: str,
    router_addresses: Sequence[str] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    router_security: ChannelSecurity | None = None,
) -> ClusterStatus:
    """The registry's pods, then one health check of each router (all routers at once, dialed with
    `router_security`; default: plain text).

    Raises `UnavailableError` when Redis does not answer within about `timeout_s`.
    """
    registry = PodRegistry(redis_url, timeout_s=timeout_s)
    try:
        pods = await registry.list_pods()
    finally:
        await registry.aclose()
    checks = await asyncio.gather(
        *(check_health(address, timeout_s=timeout_s, security=router_security) for address in router_addresses)
    )
    routers = tuple(RouterStatus(check.address, check.status.lower()) for check in checks)
    return ClusterStatus(tuple(pods), routers)


def pod_state(pod: PodInfo) -> str:
    """serving, or draining (the pod finishes its requests and takes no new ones)."""
    return "draining" if pod.draining else "serving"


def kv_usage(pod: PodInfo) -> float | None:
    """The fraction of the pod's KV blocks in use, rounded to 4 places; None when it reports no blocks."""
    if pod.num_total_blocks <= 0:
        return None
    return round((pod.num_total_blocks - pod.num_free_blocks) / pod.num_total_blocks, 4)


def to_json(status: ClusterStatus) -> str:
    """`{"pods": [...], "routers": [{"address", "state"}]}`; each pod's keys are fixed (scripts read them)."""
    pods = [
        {
            "pod_id": pod.pod_id,
            "role": pod.role,
            "address": pod.address,
            "state": pod_state(pod),
            "num_running": pod.num_running,
            "num_waiting": pod.num_waiting,
            "num_free_blocks": pod.num_free_blocks,
            "num_total_blocks": pod.num_total_blocks,
            "kv_usage": kv_usage(pod),
            "generation": pod.generation,
            "model": pod.model,
        }
        for pod in status.pods
    ]
    routers = [{"address": router.address, "state": router.state} for router in status.routers]
    return json.dumps({"pods": pods, "routers": routers}, indent=2)


def to_table(status: ClusterStatus) -> str:
    """Aligned columns: one row per pod (or a line saying there is none), then one per router, if any."""
    lines = ["no pods registered"]
    if status.pods:
        rows = [_POD_HEADER, *(_pod_row(pod) for pod in status.pods)]
        lines = _aligned(rows, _POD_RIGHT_ALIGNED)
    if status.routers:
        rows = [("ROUTER", "STATE"), *((router.address, router.state) for router in status.routers)]
        lines += ["", *_aligned(rows, frozenset())]
    return "\n".join(lines)


def _pod_row(pod: PodInfo) -> tuple[str, ...]:
    usage = kv_usage(pod)
    return (
        pod.pod_id,
        pod.role,
        pod_state(pod),
        pod.address,
        str(pod.num_running),
        str(pod.num_waiting),
        f"{pod.num_free_blocks}/{pod.num_total_blocks}",
        "-" if usage is None else f"{usage:.1%}",
    )


def _aligned(rows: Sequence[Sequence[str]], right_aligned: frozenset[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        _COLUMN_GAP.join(
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
