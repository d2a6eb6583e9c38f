"""What the router tells operators about itself (GetServerInfo, GetLoad, HTTP /health): its state and its pods."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.pod_registry import PodInfo


@dataclass(slots=True)
class ServerStatus:
    """The router's state and the pods it sees; `RouterApp` sets `draining` and `http_port`."""

    all_pods: Callable[[], list[PodInfo]]
    """Every live pod of the last registry read (draining ones included), sorted by pod id."""
    tokenizer_pool_size: int
    serving: bool = False
    """True once `RouterApp` has seen a live prefill pod and a live decode pod (health SERVING), until `drain`."""
    draining: bool = False
    http_port: int = 0
    """The HTTP API's bound port; 0 when it is off."""

    def roles(self) -> list[str]:
        """The router role, then each pod role with a live pod, in request order."""
        live = {pod.role for pod in self.all_pods()}
        return ["router", *(role for role in ("prefill", "decode") if role in live)]

    def num_serving_pods(self, role: str) -> int:
        return sum(1 for pod in self.all_pods() if pod.role == role and not pod.draining)
