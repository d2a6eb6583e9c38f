"""RunningRequests.absorb_abort: an Abort's cancellation is told apart from every other, once per task."""

from __future__ import annotations

import asyncio

import pytest

from router.completion.running_requests import AbortResult, RunningRequests

pytestmark = pytest.mark.anyio


async def _serve(running: RunningRequests, started: asyncio.Event, outcomes: list[str]) -> None:
    """Runs request "r" until cancelled, then records what absorb_abort said and how many cancels were left."""
    try:
        with running.running("r"):
            started.set()
            await asyncio.sleep(30)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        assert task is not None
        outcomes.append(f"absorbed={running.absorb_abort()} cancelling={task.cancelling()}")


async def test_an_abort_is_absorbed_once_even_when_sent_twice() -> None:
    running, started, outcomes = RunningRequests(), asyncio.Event(), []
    task = asyncio.create_task(_serve(running, started, outcomes))
    await started.wait()
    # NOTE: both before the task runs again: the second must not cancel it a second time.
    assert running.abort("r") == running.abort("r") == (AbortResult.ABORTED, 1)
    await task
    assert outcomes == ["absorbed=True cancelling=0"]
    assert running.abort("r") == (AbortResult.ALREADY_FINISHED, 0)


async def test_a_cancellation_that_is_not_an_abort_is_not_absorbed() -> None:
    running, started, outcomes = RunningRequests(), asyncio.Event(), []
    task = asyncio.create_task(_serve(running, started, outcomes))
    await started.wait()
    task.cancel()
    await task
    assert outcomes == ["absorbed=False cancelling=1"]


async def test_an_abort_beside_another_cancellation_is_not_absorbed() -> None:
    running, started, outcomes = RunningRequests(), asyncio.Event(), []
    task = asyncio.create_task(_serve(running, started, outcomes))
    await started.wait()
    running.abort("r")
    task.cancel()
    await task
    assert outcomes == ["absorbed=False cancelling=2"]
