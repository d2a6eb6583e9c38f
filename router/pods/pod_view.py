"""The router's live view of the pods: the registry, re-read every `refresh_s`, plus a client per pod.

- A refresh that fails (Redis down or slow) keeps the last known list: pods keep serving while the
  registry is away, and the next successful read replaces the list.
- A pod missing from a readable registry stays in the list for `missing_grace_s` (one registry TTL)
  after the first read that missed it: a restarted, empty Redis lists no pod until their next
  heartbeats, and those pods still serve. It leaves at once when it was last seen draining (a pod
  stopped with SIGTERM says so, then deregisters), when another listed pod took its address, or when
  a call to it answered UNAVAILABLE. A pod listed again with another generation replaces the old one.
- Draining pods stay in the list (their in-flight requests finish) but are never offered for new
  requests.
- Pods announcing another model are ignored: their block hashes and tokenizer would not match.
- A pod whose call failed (UNAVAILABLE, a keepalive that lapsed, a failed leg: `report_unavailable`) is suspect
  at once: skipped while other pods of its role remain, until it answers a health check SERVING (probed at each
  refresh, no sooner than `cooldown_s` after the failure) or is listed with another generation (restarted).
  The registry's TTL is only the backstop for pods nobody called.
- After every successful read the refresh listeners are called (router.admission.admission: capacity may have returned).
- One grpc.aio channel per pod, reused by every request, with keepalive pings (`router.pods.pod_client`); a channel
  whose pod left the list is closed after a grace period (its in-flight calls may still be finishing).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc.aio

from common.errors import UnavailableError
from common.pod_registry import PodInfo, PodRole
from common.tls import ChannelSecurity
from router.pods.local_load import LocalLoads
from router.pods.pod_client import PodClient

logger = logging.getLogger(__name__)

_CHANNEL_GRACE_S = 60.0
_PROBE_TIMEOUT_S = 0.5


class PodLister(Protocol):
    """Where the pods are listed: common.pod_registry.PodRegistry (or a test double)."""

    async def list_pods(self, role: PodRole | None = None) -> list[PodInfo]:
        """Every live pod; raises UnavailableError when the registry cannot be read."""
        ...


class PodView:
    """Live pods by role, refreshed in the background; see the module docstring."""

    def __init__(
        self,
        registry: PodLister,
        model: str,
        refresh_s: float,
        load: LocalLoads,
        cooldown_s: float = 2.0,
        missing_grace_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        channel_interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        channel_security: ChannelSecurity | None = None,
    ) -> None:
        self._registry = registry
        self._model = model
        self._refresh_s = refresh_s
        self._load = load
        self._cooldown_s = cooldown_s
        self._missing_grace_s = missing_grace_s
        self._clock = clock
        self._channel_interceptors = tuple(channel_interceptors)
        self._channel_security = channel_security or ChannelSecurity()
        self._pods: list[PodInfo] = []
        self._missing_since: dict[str, float] = {}
        self._clients: dict[str, PodClient] = {}
        self._gone_since: dict[str, float] = {}
        self._retired: list[tuple[float, PodClient]] = []
        self._suspects: dict[str, tuple[int, float]] = {}
        """Suspect pods: the generation they failed under, and when they may be probed."""
        self._warned_models: set[str] = set()
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self._refresh_listeners: list[Callable[[], None]] = []

    @property
    def all_pods(self) -> list[PodInfo]:
        """Every pod of the last successful read (draining ones included), sorted by pod id."""
        return list(self._pods)

    def pods(self, role: PodRole) -> list[PodInfo]:
        """Pods of `role` that may take a new request: not draining, and not suspect unless no other pod of the
        role is left."""
        serving = [pod for pod in self._pods if pod.role == role and not pod.draining]
        trusted = [pod for pod in serving if pod.pod_id not in self._suspects]
        return trusted or serving

    def add_refresh_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after every successful registry read, once the list is updated."""
        self._refresh_listeners.append(listener)

    def client(self, pod: PodInfo) -> PodClient:
        """The cached client of `pod` (a new one when the pod moved to another address)."""
        client = self._clients.get(pod.pod_id)
        if client is None or client.address != pod.address:
            if client is not None:
                self._retired.append((self._clock(), client))
            client = PodClient(pod.pod_id, pod.address, self._channel_interceptors, self._channel_security)
            self._clients[pod.pod_id] = client
        return client

    def report_unavailable(self, pod_id: str) -> None:
        """A call to the pod failed as a dead pod's would: it is suspect (dropped if it left the registry)."""
        generation = next((pod.generation for pod in self._pods if pod.pod_id == pod_id), 0)
        if pod_id not in self._suspects:
            logger.info(
                "pod %s (generation %d) is suspect: no new requests until it answers health", pod_id, generation
            )
        self._suspects[pod_id] = (generation, self._clock() + self._cooldown_s)
        if self._missing_since.pop(pod_id, None) is not None:
            self._pods = [pod for pod in self._pods if pod.pod_id != pod_id]

    async def start(self) -> None:
        """Read the registry once (failures are logged, not raised), then keep refreshing."""
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_loop(), name="pod-view-refresh")

    async def refresh(self) -> bool:
        """One registry read; False (and the last list kept) when Redis did not answer."""
        try:
            listed = await self._registry.list_pods()
        except UnavailableError as exc:
            if not self._failing:
                logger.warning("pod registry unreadable, keeping the last %d pods: %s", len(self._pods), exc)
            self._failing = True
            return False
        if self._failing:
            logger.info("pod registry readable again")
        self._failing = False
        self._pods = self._merge([pod for pod in listed if self._serves_our_model(pod)])
        self._load.on_refresh()
        await self._close_departed()
        await self._probe_suspects()
        for listener in self._refresh_listeners:
            try:
                listener()
            except Exception:
                # NOTE: logged, not raised: a failing listener must not stop the refresh loop.
                logger.exception("a pod view refresh listener failed")
        return True

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        clients = [*self._clients.values(), *(client for _, client in self._retired)]
        self._clients, self._retired = {}, []
        await asyncio.gather(*(client.aclose() for client in clients))

    def _merge(self, listed: list[PodInfo]) -> list[PodInfo]:
        """The listed pods plus those missing for less than `missing_grace_s`; see the module docstring."""
        now = self._clock()
        listed_ids = {pod.pod_id for pod in listed}
        taken = {pod.address for pod in listed}
        kept: list[PodInfo] = []
        for pod in self._pods:
            if pod.pod_id in listed_ids or pod.draining or pod.address in taken:
                self._missing_since.pop(pod.pod_id, None)
                continue
            since = self._missing_since.setdefault(pod.pod_id, now)
            if now - since < self._missing_grace_s:
                kept.append(pod)
            else:
                del self._missing_since[pod.pod_id]
                logger.info("pod %s left the registry %.1f s ago: dropped", pod.pod_id, now - since)
        return sorted([*listed, *kept], key=lambda pod: pod.pod_id)

    def _serves_our_model(self, pod: PodInfo) -> bool:
        if pod.model == self._model:
            return True
        if pod.pod_id not in self._warned_models:
            self._warned_models.add(pod.pod_id)
            logger.warning("ignoring pod %s: it serves model %r, the router %r", pod.pod_id, pod.model, self._model)
        return False

    async def _close_departed(self) -> None:
        present = {pod.pod_id for pod in self._pods}
        now = self._clock()
        for pod_id in list(self._clients):
            if pod_id in present:
                self._gone_since.pop(pod_id, None)
            elif now - self._gone_since.setdefault(pod_id, now) >= _CHANNEL_GRACE_S:
                del self._gone_since[pod_id]
                await self._clients.pop(pod_id).aclose()
        expired = [client for since, client in self._retired if now - since >= _CHANNEL_GRACE_S]
        self._retired = [(since, client) for since, client in self._retired if now - since < _CHANNEL_GRACE_S]
        await asyncio.gather(*(client.aclose() for client in expired))

    async def _probe_suspects(self) -> None:
        """Clear the suspects listed under another generation (restarted) or gone, and those whose probe time came
        that answer health SERVING."""
        generations = {pod.pod_id: pod.generation for pod in self._pods}
        for pod_id, (generation, _) in list(self._suspects.items()):
            if generations.get(pod_id) != generation:
                del self._suspects[pod_id]
        now = self._clock()
        due = [pod for pod in self._pods if pod.pod_id in self._suspects and self._suspects[pod.pod_id][1] <= now]
        answers = await asyncio.gather(*(self.client(pod).is_serving(_PROBE_TIMEOUT_S) for pod in due))
        for pod, serving in zip(due, answers, strict=True):
            if serving and pod.pod_id in self._suspects:
                del self._suspects[pod.pod_id]
                logger.info("pod %s answers health again: no longer suspect", pod.pod_id)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()
