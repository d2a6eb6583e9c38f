"""`LocalConnector`: the autoscaler acting on the `LocalCluster` of `pdserve up --autoscale`, in its process.

Scale-out starts one pod on a worker thread (`LocalCluster.add_pod` blocks until the pod serves and is
registered, which takes the model's load time); the role is `pending` meanwhile. Scale-in drains the least
loaded pod of the role (`pod_to_drain`) with `LocalCluster.drain_pod` (SIGTERM) and returns at once; the
planner holds until the registry shows it draining.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from autoscaler.connector import pod_to_drain
from autoscaler.planner import Decision
from common.pod_registry import PodInfo, PodRole

logger = logging.getLogger(__name__)


class PodPool(Protocol):
    """What the connector uses of a `LocalCluster`."""

    @property
    def pods(self) -> Mapping[str, object]:
        """The running pods by pod id."""
        ...

    def add_pod(self, role: PodRole) -> str: ...

    def drain_pod(self, pod_id: str) -> object: ...

    def wait_for_free_gpu(self, timeout_s: float) -> bool: ...


class LocalConnector:
    """Adds and drains pods of a running `LocalCluster`; one pod start at a time. A pod start first waits up to
    `gpu_wait_s` for the GPU of a pod that drains to free (on a fixed set of GPUs the planner gives one role's GPU
    to the other), then starts the pod anyway, sharing a GPU (logged)."""

    def __init__(self, cluster: PodPool, gpu_wait_s: float = 60.0) -> None:
        self._cluster = cluster
        self._gpu_wait_s = gpu_wait_s
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="pdserve-autoscaler-add")
        self._lock = threading.Lock()
        self._starting: dict[PodRole, Future[str]] = {}

    def pending(self) -> frozenset[PodRole]:
        with self._lock:
            return frozenset(role for role, future in self._starting.items() if not future.done())

    def scale(self, decision: Decision, pods: Sequence[PodInfo]) -> None:
        if decision.direction == "up":
            with self._lock:
                self._starting[decision.role] = self._starter.submit(self._add, decision.role)
            return
        victim = pod_to_drain(decision.role, pods)
        if victim is None or victim.pod_id not in self._cluster.pods:
            logger.warning(
                "autoscaler: no %s pod of this cluster to drain (registry: %s)", decision.role, [p.pod_id for p in pods]
            )
            return
        self._cluster.drain_pod(victim.pod_id)
        logger.info("autoscaler: draining %s pod %s", decision.role, victim.pod_id)

    def close(self) -> None:
        """Start no more pods; a pod start in flight goes on until `LocalCluster.stop` ends it."""
        self._starter.shutdown(wait=False, cancel_futures=True)

    def _add(self, role: PodRole) -> str:
        if not self._cluster.wait_for_free_gpu(self._gpu_wait_s):
            logger.warning("autoscaler: no GPU freed within %g s; the new %s pod shares one", self._gpu_wait_s, role)
        try:
            pod_id = self._cluster.add_pod(role)
        except Exception:
            logger.exception("autoscaler: starting a %s pod failed", role)
            raise
        logger.info("autoscaler: %s pod %s serves", role, pod_id)
        return pod_id
