"""The tail of a Prefill stream, read beside the Decode stream it feeds.

After the first token, a Prefill stream has one message left: TransferDone, once the decode pod
holds the whole prompt KV. The router reads it in a task while it streams the decode steps; if the
transfer fails instead, the decode pod would wait for blocks that never come, so the decode stream
is ended with the transfer's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from router.outputs import DecodeStep, FirstToken, TransferDone


async def transfer_done(prefill_stream: AsyncIterator[FirstToken | TransferDone]) -> TransferDone | None:
    """The rest of a Prefill stream after its first token: its TransferDone, if it sends one."""
    done: TransferDone | None = None
    async for event in prefill_stream:
        if isinstance(event, TransferDone):
            done = event
    return done


async def until_transfer_fails(
    steps: AsyncIterator[DecodeStep], transfer: asyncio.Task[TransferDone | None]
) -> AsyncGenerator[DecodeStep, None]:
    """The decode steps; raises the Prefill stream's error instead if it fails first (the decode
    pod would otherwise wait for blocks that never come)."""
    iterator = aiter(steps)
    next_step: asyncio.Future[DecodeStep] | None = None
    try:
        while not transfer.done():
            next_step = asyncio.ensure_future(anext(iterator))
            await asyncio.wait((next_step, transfer), return_when=asyncio.FIRST_COMPLETED)
            error = transfer.exception() if transfer.done() else None
            if error is not None and not next_step.done():
                raise error
            try:
                step = await next_step
            except StopAsyncIteration:
                return
            next_step = None
            yield step
    finally:
        if next_step is not None:
            await cancel_and_wait(next_step)
    async for step in iterator:
        yield step


async def result_within(task: asyncio.Task[TransferDone | None], timeout_s: float) -> TransferDone | None:
    """The task's result if it ends within `timeout_s` without error; None otherwise."""
    done, _ = await asyncio.wait((task,), timeout=timeout_s)
    if not done or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
