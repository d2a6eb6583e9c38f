"""Global prefix-block directory in Redis: which pod holds which KV block, by chained block hash.

Keys (prefix `pdserve`):
- `pdserve:blk:{hash_hex}`: sorted set; member `{pod_id}:{generation}` (the block is in the pod's device pool) or
  `{pod_id}:{generation}:host` (in its host tier, `engine.kv_tier`), score = when that entry expires (Unix ms).
- `pdserve:podblk:{member}`: set of the hash hexes that pod generation published for that tier, so
  `AllBlocksCleared` and `drop_pod` can find its entries.

A lookup counts, per pod, the leading run of the prompt's blocks held in either tier; a block only in the host
tier counts `host_hit_weight` of a device block (it is copied back, which costs less than recomputing it but more
than nothing).

Staleness bound: every entry expires `entry_ttl_s` after it was last written (the score; lookups ignore
expired members, and a key expires `entry_ttl_s` after its last write). Pods keep their live blocks
fresh with `refresh` (`start_refresh` runs it every entry_ttl_s / 3), which rewrites the pod's whole
block set from a local mirror of the events it published. So an entry outlives its block by at most
`entry_ttl_s` if a BlockRemoved is lost; a dead pod or an old generation never wins at all, because
lookups only count the members the caller passes in `live` (the pod registry's view).

Advisory: every call has a short socket timeout; a failed lookup returns `{}`, a failed publish drops
the batch and marks the pod dirty, and its next successful publish or refresh rewrites the pod's
state from the mirror (so a Redis restart, which loses everything, heals at the next write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from common.block_hash import BlockHash
from common.kv_cache_events import DEVICE_TIER, HOST_TIER, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from common.redis_client import open_redis

logger = logging.getLogger(__name__)

_REFRESH_CHUNK = 1024
_TIERS = (DEVICE_TIER, HOST_TIER)

# KEYS: the prompt's block keys in order; ARGV: the live (device tier) members. Returns each member's leading run in
# either tier and how many blocks of it are in the host tier only, flat: run_1, host_1, run_2, host_2, ...
_LONGEST_PREFIX_LUA = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local runs, hosts, active = {}, {}, {}
for i = 1, #ARGV do runs[i] = 0; hosts[i] = 0; active[i] = i end
for b = 1, #KEYS do
  local names = {}
  for j, m in ipairs(active) do names[2 * j - 1] = ARGV[m]; names[2 * j] = ARGV[m] .. ':host' end
  local scores = redis.call('ZMSCORE', KEYS[b], unpack(names))
  local still = {}
  for j, m in ipairs(active) do
    local device, host = scores[2 * j - 1], scores[2 * j]
    if device and tonumber(device) > now_ms then
      runs[m] = b; still[#still + 1] = m
    elseif host and tonumber(host) > now_ms then
      runs[m] = b; hosts[m] = hosts[m] + 1; still[#still + 1] = m
    end
  end
  active = still
  if #active == 0 then break end
end
local out = {}
for i = 1, #ARGV do out[2 * i - 1] = runs[i]; out[2 * i] = hosts[i] end
return out
"""

# KEYS[1]: a pod generation's index; ARGV: its member, the block key prefix, the entries' expiry (Unix ms), the keys'
# TTL (ms), then (op, hash hex) pairs in order: "+" stores the block, "-" removes it. One command per batch: redis-py
# packs and parses each command in Python, and a batch of a busy prefill pod holds thousands of blocks.
_APPLY_LUA = """
local index, member, prefix = KEYS[1], ARGV[1], ARGV[2]
local expiry, ttl, stored = ARGV[3], tonumber(ARGV[4]), false
for i = 5, #ARGV, 2 do
  local hex = ARGV[i + 1]
  local key = prefix .. hex
  if ARGV[i] == '+' then
    redis.call('ZADD', key, expiry, member)
    redis.call('PEXPIRE', key, ttl)
    redis.call('SADD', index, hex)
    stored = true
  else
    redis.call('ZREM', key, member)
    redis.call('SREM', index, hex)
  end
end
if stored then redis.call('PEXPIRE', index, ttl) end
return 1
"""

# KEYS[1]: a pod generation's index; ARGV[1]: its member; ARGV[2]: the block key prefix.
_DROP_POD_LUA = """
local hexes = redis.call('SMEMBERS', KEYS[1])
for _, hex in ipairs(hexes) do redis.call('ZREM', ARGV[2] .. hex, ARGV[1]) end
redis.call('DEL', KEYS[1])
return #hexes
"""


@dataclass(slots=True, frozen=True)
class DirectoryStats:
    """Counters of one `PrefixDirectory` since it was made."""

    lookups: int
    hits: int
    """Lookups where some live pod held at least the first block."""
    errors: int
    """Lookups that failed (answered `{}`)."""
    last_latency_s: float
    """Duration of the last lookup that went to Redis."""
    publishes: int
    """`publish` calls."""
    publish_errors: int
    """Failed writes (`publish`, `refresh`, `drop_pod`)."""


def _member(pod_id: str, generation: int, tier: str = DEVICE_TIER) -> str:
    return f"{pod_id}:{generation}" if tier == DEVICE_TIER else f"{pod_id}:{generation}:{tier}"


class PrefixDirectory:
    """Pods publish their KV cache events; the router asks which live pod holds the longest prefix."""

    def __init__(
        self,
        redis_url: str,
        key_prefix: str = "pdserve",
        entry_ttl_s: float = 300.0,
        timeout_s: float = 0.3,
        host_hit_weight: float = 1.0,
    ) -> None:
        self._host_hit_weight = host_hit_weight
        self._redis = open_redis(redis_url, timeout_s)
        self._entry_ttl_s = entry_ttl_s
        self._ttl_ms = max(1, round(entry_ttl_s * 1000))
        self._block_prefix = f"{key_prefix}:blk:"
        self._index_prefix = f"{key_prefix}:podblk:"
        self._longest_prefix = self._redis.register_script(_LONGEST_PREFIX_LUA)
        self._held: dict[str, set[BlockHash]] = {}
        self._dirty: set[str] = set()
        self._write_lock = asyncio.Lock()
        self._refresh_task: asyncio.Task[None] | None = None
        self._failing = False
        self._lookups = self._hits = self._errors = self._publishes = self._publish_errors = 0
        self._last_latency_s = 0.0

    @property
    def stats(self) -> DirectoryStats:
        return DirectoryStats(
            self._lookups, self._hits, self._errors, self._last_latency_s, self._publishes, self._publish_errors
        )

    async def longest_prefix(self, block_hashes: Sequence[BlockHash], live: Mapping[str, int]) -> dict[str, float]:
        """For each pod in `live` (pod_id -> current generation), how many LEADING blocks of the prompt
        it holds, a block in its host tier only counting `host_hit_weight`, in one round trip. `{}` when Redis fails
        or is slow (never raises for Redis)."""
        self._lookups += 1
        if not live:
            return {}
        pod_ids = list(live)
        if not block_hashes:
            return dict.fromkeys(pod_ids, 0)
        keys = [self._block_prefix + block_hash.hex() for block_hash in block_hashes]
        members = [_member(pod_id, live[pod_id]) for pod_id in pod_ids]
        start = time.perf_counter()
        try:
            flat = await self._longest_prefix(keys=keys, args=members)
        except RedisError as exc:
            self._errors += 1
            self._on_failure("lookup", exc)
            return {}
        finally:
            self._last_latency_s = time.perf_counter() - start
        self._on_success()
        weight = self._host_hit_weight
        result = {
            pod_id: int(run) - (1.0 - weight) * int(host)
            for pod_id, run, host in zip(pod_ids, flat[::2], flat[1::2], strict=True)
        }
        if any(result.values()):
            self._hits += 1
        return result

    async def publish(self, pod_id: str, generation: int, events: Iterable[KVCacheEvent]) -> bool:
        """Apply one batch of a pod's cache events, in order, in one pipelined round trip.

        False if Redis failed: the batch is dropped and counted, and the pod's next successful
        `publish` or `refresh` rewrites its whole state instead. Calls are serialized per directory.
        """
        members = {tier: _member(pod_id, generation, tier) for tier in _TIERS}
        async with self._write_lock:
            self._publishes += 1
            pipe = self._redis.pipeline(transaction=False)
            expiry_ms = self._expiry_ms()
            ops: dict[str, list[str]] = {member: [] for member in members.values()}
            # NOTE: the host tier's member is known (and dropped on a clear) once the pod published to it.
            self._held.setdefault(members[DEVICE_TIER], set())
            for event in events:
                match event:
                    case BlockStored(block_hashes=hashes, tier=tier):
                        self._held.setdefault(members[tier], set()).update(hashes)
                        ops[members[tier]] += _ops("+", hashes)
                    case BlockRemoved(block_hashes=hashes, tier=tier):
                        self._held.setdefault(members[tier], set()).difference_update(hashes)
                        ops[members[tier]] += _ops("-", hashes)
                    case AllBlocksCleared():
                        for member in filter(self._held.__contains__, members.values()):
                            self._held[member].clear()
                            self._queue_ops(pipe, member, ops[member], expiry_ms)
                            ops[member] = []
                            self._queue_drop(pipe, member)
            for member, member_ops in ops.items():
                self._queue_ops(pipe, member, member_ops, expiry_ms)
            if any(member in self._dirty for member in members.values()):
                # NOTE: the mirror already holds this batch; the rewrite replaces the queued commands.
                return await self._rewrite_pod(members.values())
            if len(pipe) == 0:
                return True
            if await self._execute(pipe, "publish"):
                return True
            self._dirty.update(members.values())
            return False

    async def refresh(self, pod_id: str, generation: int) -> bool:
        """Rewrite every block the pod holds (as its published events say) with a fresh expiry."""
        async with self._write_lock:
            return await self._rewrite_pod([_member(pod_id, generation, tier) for tier in _TIERS])

    def start_refresh(self, pod_id: str, generation: int, interval_s: float | None = None) -> asyncio.Task[None]:
        """Run `refresh` every `interval_s` (default entry_ttl_s / 3) until `aclose`."""
        if self._refresh_task is not None and not self._refresh_task.done():
            raise RuntimeError("refresh already running")
        period = self._entry_ttl_s / 3 if interval_s is None else interval_s
        self._refresh_task = asyncio.create_task(
            self._refresh_loop(pod_id, generation, period), name="prefix-directory-refresh"
        )
        return self._refresh_task

    async def drop_pod(self, pod_id: str, generation: int) -> bool:
        """Remove every entry of one pod generation (graceful shutdown, or a pod seen gone)."""
        async with self._write_lock:
            pipe = self._redis.pipeline(transaction=False)
            for tier in _TIERS:
                member = _member(pod_id, generation, tier)
                self._held.pop(member, None)
                self._dirty.discard(member)
                self._queue_drop(pipe, member)
            return await self._execute(pipe, "drop_pod")

    async def aclose(self) -> None:
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._redis.aclose()

    def _queue_ops(self, pipe: Pipeline, member: str, ops: Sequence[str], expiry_ms: int) -> None:
        """One command applying `ops` ((op, hash hex) pairs, see `_APPLY_LUA`) in order, if there are any.

        NOTE: a key's TTL is renewed on each store; every member's expiry is <= the key's. EVAL with the body, as
        `_queue_drop`: one round trip even right after a Redis restart.
        """
        if ops:
            index = self._index_prefix + member
            pipe.eval(_APPLY_LUA, 1, index, member, self._block_prefix, expiry_ms, self._ttl_ms, *ops)

    def _queue_drop(self, pipe: Pipeline, member: str) -> None:
        # NOTE: EVAL with the body, not EVALSHA: stays one round trip even right after a Redis restart.
        pipe.eval(_DROP_POD_LUA, 1, self._index_prefix + member, member, self._block_prefix)

    async def _rewrite_pod(self, members: Iterable[str]) -> bool:
        """`_rewrite` each tier's member of a pod (all of them, even when one fails); the write lock is held. A
        dirty tier dirties the pod: its other tier is dropped and rewritten too."""
        members = list(members)
        if any(member in self._dirty for member in members):
            self._dirty.update(members)
        return all([await self._rewrite(member) for member in members])

    async def _rewrite(self, member: str) -> bool:
        """Drop (if dirty) and rewrite the member's whole held set, in chunks; the write lock is held."""
        hashes = list(self._held.get(member, ()))
        expiry_ms = self._expiry_ms()
        for start in range(0, max(len(hashes), 1), _REFRESH_CHUNK):
            pipe = self._redis.pipeline(transaction=False)
            if start == 0 and member in self._dirty:
                self._queue_drop(pipe, member)
            self._queue_ops(pipe, member, _ops("+", hashes[start : start + _REFRESH_CHUNK]), expiry_ms)
            if len(pipe) and not await self._execute(pipe, "refresh"):
                self._dirty.add(member)
                return False
        self._dirty.discard(member)
        return True

    async def _refresh_loop(self, pod_id: str, generation: int, interval_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        # NOTE: redis-py can swallow a cancellation (asyncio.wait_for on Python 3.11); a pending one ends the loop.
        while not task.cancelling():
            await asyncio.sleep(interval_s)
            await self.refresh(pod_id, generation)

    async def _execute(self, pipe: Pipeline, what: str) -> bool:
        try:
            await pipe.execute()
        except RedisError as exc:
            self._publish_errors += 1
            self._on_failure(what, exc)
            return False
        self._on_success()
        return True

    def _expiry_ms(self) -> int:
        return int(time.time() * 1000) + self._ttl_ms

    def _on_failure(self, what: str, exc: RedisError) -> None:
        if not self._failing:
            logger.warning("prefix directory: Redis %s failed, degrading until it answers again: %s", what, exc)
        self._failing = True

    def _on_success(self) -> None:
        if self._failing:
            logger.info("prefix directory: Redis answers again")
        self._failing = False


def _ops(op: str, hashes: Iterable[BlockHash]) -> list[str]:
    """`_APPLY_LUA`'s (op, hash hex) pairs of one op over `hashes`, flat."""
    return [item for block_hash in hashes for item in (op, block_hash.hex())]
