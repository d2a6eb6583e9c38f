"""`AutoscaleDriver`: the autoscaler's loop around the pure planner.

Each `tick`, in order: read every pod from the registry, build a `ClusterSnapshot` (with the roles the
connector is still applying a change to), ask the `Planner` for one decision per role, record each decision
(metrics and log), and hand the non-hold ones to the `Connector`. `run` ticks once per `autoscale_interval_s`
until its stop event is set. A registry read that fails skips the tick (logged); the planner sees nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from autoscaler.config import AutoscalerConfig
from autoscaler.connector import Connector
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.planner import Decision, Planner
from autoscaler.snapshot import ClusterSnapshot, PodSnapshot
from common.errors import UnavailableError
from common.pod_registry import PodInfo

logger = logging.getLogger(__name__)

ListPods = Callable[[], Awaitable[list[PodInfo]]]
"""Every live pod (`PodRegistry.list_pods`)."""


class AutoscaleDriver:
    """Reads the registry, plans, records and scales; `clock` gives the snapshots' `now_s` (monotonic)."""

    def __init__(
        self,
        config: AutoscalerConfig,
        list_pods: ListPods,
        connector: Connector,
        metrics: AutoscalerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = config.autoscale_interval_s
        self._planner = Planner(config)
        self._list_pods = list_pods
        self._connector = connector
        self._metrics = metrics
        self._clock = clock

    async def tick(self) -> tuple[Decision, Decision] | None:
        """One round; the (prefill, decode) decisions, or None when the registry could not be read."""
        # NOTE: pending is read before the pods: a change the connector finishes in between (a pod start ends once
        # the pod is registered) then shows in the pods, never in neither.
        pending = self._connector.pending()
        try:
            pods = await self._list_pods()
        except UnavailableError as exc:
            logger.warning("autoscaler: skipping a round, the registry is unavailable: %s", exc)
            return None
        snapshot = ClusterSnapshot(self._clock(), tuple(PodSnapshot.from_pod_info(p) for p in pods), pending)
        decisions = self._planner.decide(snapshot)
        for decision in decisions:
            self._metrics.record(decision)
            if decision.direction != "hold":
                self._connector.scale(decision, pods)
        return decisions

    async def run(self, stop: threading.Event) -> None:
        """Tick every `autoscale_interval_s` until `stop` is set (checked between ticks), then close the
        connector."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                await self.tick()
                remaining_s = self._interval_s - (time.monotonic() - started)
                if remaining_s > 0:
                    await asyncio.to_thread(stop.wait, remaining_s)
        finally:
            self._connector.close()
