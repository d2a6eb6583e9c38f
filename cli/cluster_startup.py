"""Start-up waits of the local cluster: every process SERVING on grpc.health.v1 (with a progress bar) and every
pod in the Redis registry; and the registry's pods."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from cli.cluster_config import ClusterConfig
from cli.service_process import POLL_S, ClusterError, ServiceProcess
from common.pod_registry import PodInfo, PodRegistry
from common.redis_client import redact

logger = logging.getLogger(__name__)


async def wait_serving(
    config: ClusterConfig, redis_url: str, processes: Sequence[ServiceProcess], pod_ids: Sequence[str]
) -> None:
    """Wait until each process is SERVING and each pod id is registered (and not draining)."""
    started = time.monotonic()
    timeout_s = config.startup_timeout_s
    show = config.show_progress
    with (
        logging_redirect_tqdm(),
        tqdm(total=len(processes), desc="starting pdserve", unit="proc", disable=not show, file=sys.stderr) as bar,
    ):

        async def one(process: ServiceProcess) -> None:
            await process.wait_serving(timeout_s)
            bar.update(1)
            logger.info("%s serving on %s after %.1f s", process.name, process.address, time.monotonic() - started)

        await asyncio.gather(*(one(p) for p in processes))
    await _registered(redis_url, pod_ids, timeout_s - (time.monotonic() - started))


async def _registered(redis_url: str, pod_ids: Sequence[str], timeout_s: float) -> None:
    """Wait until every pod id is in the registry and not draining."""
    registry = PodRegistry(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            live = {pod.pod_id for pod in await registry.list_pods() if not pod.draining}
            missing = sorted(set(pod_ids) - live)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"pods {missing} serve but are not in the registry at {redact(redis_url)}")
            await asyncio.sleep(POLL_S)
    finally:
        await registry.aclose()


async def list_pods(redis_url: str) -> list[PodInfo]:
    registry = PodRegistry(redis_url)
    try:
        return await registry.list_pods()
    finally:
        await registry.aclose()
