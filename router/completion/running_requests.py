"""The requests running in this router process, by request id, so that `Abort` can cancel them on either API.

1. `RequestLifecycle.generate` registers the task consuming a request's stream (`running`) for as long as the
   stream is open; a caller may reuse a request id, so an id maps to every task running under it.
2. `abort(request_id)` cancels those tasks (once each: a second Abort of a task already cancelled by one does not
   cancel it again): the consumer (the gRPC handler, or the HTTP response) sees CancelledError where it waits,
   closes the stream, and with it every pod call and the request's KV.
3. The consumer then ends its call with a status or an error event of its own (CANCELLED; `RequestAbortedError` on
   gRPC), never by letting the CancelledError escape: grpc.aio takes a handler that ends in CancelledError for one
   whose client went away and sends no status at all, so the client would wait for its deadline. `absorb_abort`
   tells an Abort's cancellation from the others (the client went away, the server is stopping).
4. When a stream ends, however it ends, its id joins the last `max_finished` finished ids, so an abort that
   comes late answers ALREADY_FINISHED rather than NOT_FOUND.
Per process: with `--workers N` each router process knows its own requests only; an Abort reaching one process is
forwarded to the others (router.processes.sibling_aborts) and their answers merge (`merge_aborts`). The count of running
requests goes to `on_count` at every change (the whole router's count: router.processes.shared_counts).
"""

from __future__ import annotations

import asyncio
import enum
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from common.errors import PdserveError


class AbortResult(enum.Enum):
    ABORTED = "aborted"
    ALREADY_FINISHED = "already_finished"
    NOT_FOUND = "not_found"


class RequestAbortedError(PdserveError):
    """The request was aborted by `Abort` while its stream was open."""

    status = "CANCELLED"


def merge_aborts(answers: Iterable[tuple[AbortResult, int]]) -> tuple[AbortResult, int]:
    """One answer from each process's (result, number cancelled): ABORTED with the sum if any aborted, else
    ALREADY_FINISHED if any knew the id as finished, else NOT_FOUND."""
    results = set()
    num_aborted = 0
    for result, count in answers:
        results.add(result)
        num_aborted += count
    for result in (AbortResult.ABORTED, AbortResult.ALREADY_FINISHED):
        if result in results:
            return result, num_aborted
    return AbortResult.NOT_FOUND, 0


class RunningRequests:
    """Request id -> the tasks running it, in this process (see the module docstring); `on_count` hears the
    number of running tasks after each change."""

    def __init__(self, max_finished: int = 4096, on_count: Callable[[int], None] | None = None) -> None:
        self._running: dict[str, set[asyncio.Task[object]]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._aborted: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        self._max_finished = max_finished
        self._num_running = 0
        self._on_count = on_count

    def __len__(self) -> int:
        return self._num_running

    @contextmanager
    def running(self, request_id: str) -> Iterator[None]:
        """Registers the current task under `request_id` for the duration of the block."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._running.setdefault(request_id, set()).add(task)
        self._count(+1)
        try:
            yield
        finally:
            tasks = self._running.get(request_id, set())
            tasks.discard(task)
            if not tasks:
                self._running.pop(request_id, None)
            self._count(-1)
            self._finished[request_id] = None
            self._finished.move_to_end(request_id)
            while len(self._finished) > self._max_finished:
                self._finished.popitem(last=False)

    def abort(self, request_id: str) -> tuple[AbortResult, int]:
        """Cancel every task running `request_id`: (what was found, how many tasks were cancelled)."""
        tasks = self._running.get(request_id)
        if tasks:
            for task in tasks:
                if task not in self._aborted:
                    self._aborted.add(task)
                    task.cancel()
            return AbortResult.ABORTED, len(tasks)
        if request_id in self._finished:
            return AbortResult.ALREADY_FINISHED, 0
        return AbortResult.NOT_FOUND, 0

    def absorb_abort(self) -> bool:
        """In an `except CancelledError` of a task that ran a request: True (and the cancellation undone) when it came
        from `abort` alone; False when the task was not aborted, or was cancelled for another reason too."""
        task = asyncio.current_task()
        if task is None or task not in self._aborted:
            return False
        self._aborted.discard(task)
        if task.cancelling() > 1:
            return False
        task.uncancel()
        return True

    def _count(self, delta: int) -> None:
        self._num_running += delta
        if self._on_count is not None:
            self._on_count(self._num_running)
