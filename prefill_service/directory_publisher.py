"""Publishes a prefill pod's KV cache events to the Redis prefix directory, in batches, from an asyncio task."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from common.kv_cache_events import KVCacheEvent
from common.prefix_directory import PrefixDirectory

DEFAULT_BATCH_INTERVAL_S = 0.05


class DirectoryPublisher:
    """`offer(events)` may be called from any thread (the engine's on_step hook): it only queues them and wakes
    the publishing task, which sends whatever has accumulated in one `PrefixDirectory.publish`, at most once per
    `batch_interval_s`. The directory's refresh task keeps the pod's entries from expiring while it lives.
    """

    def __init__(
        self,
        directory: PrefixDirectory,
        pod_id: str,
        generation: int,
        batch_interval_s: float = DEFAULT_BATCH_INTERVAL_S,
    ) -> None:
        self._directory = directory
        self._pod_id = pod_id
        self._generation = generation
        self._batch_interval_s = batch_interval_s
        self._lock = threading.Lock()
        self._pending: list[KVCacheEvent] = []
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        """Start publishing (and refreshing the pod's entries); call on the event loop."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="directory-publisher")
        self._directory.start_refresh(self._pod_id, self._generation)

    def offer(self, events: Sequence[KVCacheEvent]) -> None:
        """Queue events for the next batch; thread-safe and non-blocking."""
        if not events or self._loop is None:
            return
        with self._lock:
            was_empty = not self._pending
            self._pending.extend(events)
        if was_empty:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def flush(self) -> None:
        """Publish every queued event now."""
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            await self._directory.publish(self._pod_id, self._generation, batch)

    async def aclose(self) -> None:
        """Stop publishing, remove this pod generation's entries from the directory, close the client."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            # NOTE: awaited, not cancelled: a cancellation inside a Redis call can be swallowed by the client.
            await task
        await self._directory.drop_pod(self._pod_id, self._generation)
        await self._directory.aclose()

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            if not self._closing:
                await asyncio.sleep(self._batch_interval_s)
