"""How the autoscaler's decisions reach the pods: the `Connector` protocol, the choice of the pod a scale-in
drains (`pod_to_drain`), and `KubernetesConnector`, which only publishes the target counts.

A connector gets every non-hold `Decision` of the driver (`scale`), reports the roles whose last change it is
still applying (`pending`, read into each snapshot), and is closed once the driver stops. A scale-in always
drains: the connector stops one pod of the role gracefully (SIGTERM: the pod reports draining, finishes its
requests, deregisters and exits), never kills it. The connectors: `LocalConnector` (autoscaler/local_connector.py),
`ComposeConnector` (autoscaler/compose_connector.py) and `KubernetesConnector` below.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from autoscaler.planner import Decision
from common.metrics import PREFIX
from common.pod_registry import PodInfo, PodRole

logger = logging.getLogger(__name__)


class Connector(Protocol):
    """Applies the planner's changes to a deployment."""

    def pending(self) -> frozenset[PodRole]:
        """The roles whose last change is still being applied (the planner holds them)."""
        ...

    def scale(self, decision: Decision, pods: Sequence[PodInfo]) -> None:
        """Start applying `decision` (up or down, one pod) to the deployment whose registry lists `pods`."""
        ...

    def close(self) -> None:
        """Apply nothing more; called once, after the driver's last `scale`."""
        ...


def pod_to_drain(role: PodRole, pods: Sequence[PodInfo]) -> PodInfo | None:
    """The pod of `role` a scale-in drains: the least loaded one not already draining (fewest running + waiting
    requests, then most free KV blocks; among equals the last in pod id order); None if there is none."""
    candidates = sorted((p for p in pods if p.role == role and not p.draining), key=lambda p: p.pod_id, reverse=True)
    # NOTE: min keeps the first of equal keys: the last pod id wins ties.
    return min(candidates, key=lambda p: (p.num_running + p.num_waiting, -p.num_free_blocks), default=None)


class KubernetesConnector:
    """Acts on nothing: publishes each role's target count, `pdserve:autoscaler_target_replicas{role}`, for
    KEDA or an HPA on external metrics to scale the role's Deployment to.

    NOTE: the target is the count of the last change asked for; unlike `autoscaler_desired_replicas` it does not
    fall back to the current count while the planner holds (a pending change), so the scaler never undoes it.
    The series of a role appears with its first change.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._target = Gauge(
            PREFIX + "autoscaler_target_replicas",
            "Pods per role the autoscaler last asked for (KEDA/HPA scale to it).",
            ["role"],
            registry=registry,
        )

    def pending(self) -> frozenset[PodRole]:
        return frozenset()

    def scale(self, decision: Decision, pods: Sequence[PodInfo]) -> None:
        self._target.labels(decision.role).set(decision.desired)
        logger.info("autoscaler: target %s replicas %d", decision.role, decision.desired)

    def close(self) -> None:
        pass
