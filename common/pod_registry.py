"""Pod registry in Redis: each pod announces itself under a key with a TTL that its heartbeat renews.

Keys: `{prefix}:pod:{pod_id}` holds the pod's `PodInfo` as JSON with a TTL of `ttl_s`; the set
`{prefix}:pods` indexes the pod ids so `list_pods` reads every live pod in one Lua call (no SCAN over
the whole keyspace, which also holds the prefix directory). A pod that stops heartbeating vanishes
when its TTL lapses; `list_pods` prunes its id from the index on the way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from redis.exceptions import RedisError

from common.errors import UnavailableError
from common.redis_client import open_redis

logger = logging.getLogger(__name__)

T = TypeVar("T")

PodRole = Literal["prefill", "decode"]

# KEYS[1]: the pod id index; ARGV[1]: the pod key prefix. Returns the JSON of every live pod.
_LIST_PODS_LUA = """
local out = {}
for _, pod_id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local info = redis.call('GET', ARGV[1] .. pod_id)
  if info then out[#out + 1] = info else redis.call('SREM', KEYS[1], pod_id) end
end
return out
"""


@dataclass(slots=True, frozen=True)
class PodInfo:
    """What a pod announces: identity, where to reach it, and its load at the last heartbeat."""

    pod_id: str
    role: PodRole
    address: str
    """host:port of the pod's gRPC server."""
    model: str
    generation: int
    """Changes when the pod restarts (e.g. its start time in ns): old cache entries stop counting."""
    kv_endpoint: str = ""
    """host:port of a decode pod's KV receiver; empty for prefill pods."""
    draining: bool = False
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_reserved_blocks: int = 0
    """Decode pods: of the blocks not free, those reserved for requests not admitted yet (their prompt KV not yet
    computed or not yet arrived); an entry without it (a pod of an older version) reads as 0."""
    queued_prompt_tokens: int | None = None
    """Prefill pods: prompt tokens not yet computed (waiting and running requests); None where not reported."""
    step_ms: float = 0.0
    """Moving average of the engine's time per step while requests run (a decode pod's time per output token)."""
    tensor_parallel_size: int = 1
    """Devices each layer of the pod's model is split over; KV moves only between pods of the same sizes."""
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.role not in get_args(PodRole):
            raise ValueError(f"role must be one of {get_args(PodRole)}, got {self.role!r}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> PodInfo:
        """Parse `to_json`'s output; unknown fields (from a newer pod) are ignored."""
        data = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


class PodRegistry:
    """Register, heartbeat, deregister and list pods.

    Calls raise `UnavailableError` when Redis does not answer within `timeout_s`; the background
    heartbeat (`start_heartbeat`) instead keeps going through outages and re-registers when Redis is back.
    """

    def __init__(self, redis_url: str, ttl_s: float = 3.0, key_prefix: str = "pdserve", timeout_s: float = 0.5) -> None:
        self._redis = open_redis(redis_url, timeout_s)
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._ttl_s = ttl_s
        self._pod_key_prefix = f"{key_prefix}:pod:"
        self._index_key = f"{key_prefix}:pods"
        self._list_pods = self._redis.register_script(_LIST_PODS_LUA)
        self._heartbeat_task: asyncio.Task[None] | None = None

    async def register(self, info: PodInfo) -> None:
        """Announce the pod (the first heartbeat)."""
        await self.heartbeat(info)
        logger.info("registered %s pod %s at %s (generation %d)", info.role, info.pod_id, info.address, info.generation)

    async def heartbeat(self, info: PodInfo) -> None:
        """Write `info` with a fresh TTL, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._pod_key_prefix + info.pod_id, info.to_json(), px=self._ttl_ms)
        pipe.sadd(self._index_key, info.pod_id)
        await self._call(pipe.execute())

    async def deregister(self, pod_id: str) -> None:
        """Remove the pod at once (a graceful shutdown), instead of waiting for its TTL."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(self._pod_key_prefix + pod_id)
        pipe.srem(self._index_key, pod_id)
        await self._call(pipe.execute())

    async def list_pods(self, role: PodRole | None = None) -> list[PodInfo]:
        """Every live pod (of `role`, if given), sorted by pod id, in one round trip."""
        raws = await self._call(self._list_pods(keys=[self._index_key], args=[self._pod_key_prefix]))
        pods: list[PodInfo] = []
        for raw in raws:
            try:
                pod = PodInfo.from_json(raw)
            except (ValueError, TypeError) as exc:
                logger.warning("skipping malformed pod entry %r: %s", raw, exc)
                continue
            if role is None or pod.role == role:
                pods.append(pod)
        return sorted(pods, key=lambda pod: pod.pod_id)

    def start_heartbeat(self, get_info: Callable[[], PodInfo], interval_s: float | None = None) -> asyncio.Task[None]:
        """Heartbeat `get_info()` every `interval_s` (default ttl_s / 3) in a background task.

        The task survives Redis outages (logged once per outage, not once per beat) and ends with
        `stop_heartbeat` or `aclose`.
        """
        if self._heartbeat_task is not None and not self._heartbeat_task.done():
            raise RuntimeError("heartbeat already running")
        period = self._ttl_s / 3 if interval_s is None else interval_s
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(get_info, period), name="pod-heartbeat")
        return self._heartbeat_task

    async def stop_heartbeat(self) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the heartbeat and close the connections (the pod's key is left to its TTL)."""
        await self.stop_heartbeat()
        await self._redis.aclose()

    async def _heartbeat_loop(self, get_info: Callable[[], PodInfo], interval_s: float) -> None:
        failing = False
        task = asyncio.current_task()
        assert task is not None
        # NOTE: redis-py can swallow a cancellation (asyncio.wait_for on Python 3.11); a pending one ends the loop.
        while not task.cancelling():
            try:
                await self.heartbeat(get_info())
            except Exception as exc:
                if not failing:
                    logger.warning("pod heartbeat failing, will keep trying every %.2f s: %s", interval_s, exc)
                failing = True
            else:
                if failing:
                    logger.info("pod heartbeat recovered")
                failing = False
            await asyncio.sleep(interval_s)

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except RedisError as exc:
            raise UnavailableError(f"pod registry: Redis unavailable: {exc}") from exc
