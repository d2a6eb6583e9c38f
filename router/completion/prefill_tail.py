"""The tail of a Prefill stream, read beside the decode it feeds.

After the first token, a Prefill stream has one message left: TransferDone, once the decode pod holds the whole
prompt KV. The router reads it in a task while it streams the decode steps (`router.completion.completion_leg`); if the
transfer fails instead, the decode pod would wait for blocks that never come, so the leg fails its decode with the
transfer's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from router.outputs import FirstToken, TransferDone


async def transfer_done(prefill_stream: AsyncIterator[FirstToken | TransferDone]) -> TransferDone | None:
    """The rest of a Prefill stream after its first token: its TransferDone, if it sends one."""
    done: TransferDone | None = None
    async for event in prefill_stream:
        if isinstance(event, TransferDone):
            done = event
    return done


async def result_within(task: asyncio.Task[TransferDone | None], timeout_s: float) -> TransferDone | None:
    """The task's result if it ends within `timeout_s` without error; None otherwise."""
    # NOTE: the transfer usually ended long before the completion: no wait (a future and a timer) for it then.
    if not task.done():
        await asyncio.wait((task,), timeout=timeout_s)
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    if task.done():
        if not task.cancelled():
            task.exception()  # NOTE: marks a failure as retrieved (the leg reported it already)
        return
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
