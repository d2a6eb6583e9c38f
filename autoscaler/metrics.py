"""The autoscaler's Prometheus metrics and decision log, kept out of the pure planner: `record` each `Decision`.

- `pdserve:autoscaler_desired_replicas{role}`: the pod count the last decision asked for;
- `pdserve:autoscaler_scaling_decisions_total{role,direction}`: decisions taken, direction up | down | hold.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge

from autoscaler.planner import Decision
from common.metrics import PREFIX

logger = logging.getLogger(__name__)


class AutoscalerMetrics:
    """The autoscaler's series in `registry` (tests pass a private `CollectorRegistry`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._desired = Gauge(
            PREFIX + "autoscaler_desired_replicas",
            "Pods the autoscaler asks for, per role.",
            ["role"],
            registry=registry,
        )
        self._decisions = Counter(
            PREFIX + "autoscaler_scaling_decisions",
            "Planner decisions, per role and direction (up | down | hold).",
            ["role", "direction"],
            registry=registry,
        )

    def record(self, decision: Decision) -> None:
        """Count `decision`, publish its desired count and log it with its reason (a hold at DEBUG level)."""
        self._desired.labels(decision.role).set(decision.desired)
        self._decisions.labels(decision.role, decision.direction).inc()
        level = logging.DEBUG if decision.direction == "hold" else logging.INFO
        logger.log(
            level,
            "autoscaler: %s %s %d -> %d: %s",
            decision.role,
            decision.direction,
            decision.current,
            decision.desired,
            decision.reason,
        )
