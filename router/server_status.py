"""What the router tells operators about itself (GetServerInfo, GetLoad, HTTP /health): its state and its pods.

With `--workers N` the process answering tells its own state (health, draining: each process drains on the
supervisor's signal) and index, and the whole router's running requests and tokenizer workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.pod_registry import PodInfo


def _no_requests() -> int:
    return 0


@dataclass(slots=True)
class ServerStatus:
    """The router's state and the pods it sees; `RouterApp` sets `draining` and `http_port`."""

    all_pods: Callable[[], list[PodInfo]]
    """Every live pod of the last registry read (draining ones included), sorted by pod id."""
    tokenizer_pool_size: int
    """Tokenizer workers of the whole router (every process's)."""
    num_running_requests: Callable[[], int] = _no_requests
    """Requests running in the whole router (every process)."""
    router_worker: int = 0
    """Which of the router's processes this is."""
    num_router_workers: int = 1
    """Processes serving the router's ports."""
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
