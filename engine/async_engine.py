"""Runs an `LLMEngine` on its own thread for asyncio services (the prefill and decode pods).

The engine is single-threaded: every call that touches it is queued as a command and executed on the
engine thread between steps. Step outputs go back to each request's asyncio queue. With `nice`, the engine thread
(and the OpenMP workers its steps start, which inherit it) runs that much nicer than the process's other threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from typing import TypeVar

from common.errors import UnavailableError
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput

logger = logging.getLogger(__name__)
T = TypeVar("T")
StepHook = Callable[[LLMEngine, list[EngineOutput]], None]
UpdateHook = Callable[[LLMEngine], None]


class EngineDeadError(UnavailableError):
    """The engine thread stopped on an error; no request can make progress on this engine. NOTE: UNAVAILABLE at a
    pod's gRPC boundary, so the router migrates the pod's in-flight requests (the pod leaves routing meanwhile)."""


class AsyncEngine:
    """`on_step(engine, outputs)` runs on the engine thread after every step; `on_update(engine)` after every step
    and every batch of commands (e.g. to publish a snapshot of the engine's load that other threads read).
    `step_started_ns` is the wall-clock start (time.time_ns) of the latest step, for the hooks. `nice`: added to the
    engine thread's niceness when it starts (Linux, where niceness is per thread; elsewhere ignored with a warning)."""

    def __init__(
        self,
        engine: LLMEngine,
        on_step: StepHook | None = None,
        on_update: UpdateHook | None = None,
        nice: int = 0,
    ) -> None:
        self.engine = engine
        self._nice = nice
        self.step_started_ns = 0
        self._on_step = on_step
        self._on_update = on_update
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[EngineOutput | BaseException]]] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(lambda: None)
        self._thread.join(timeout=10)

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps and return its result."""
        future: Future[T] = Future()

        def command() -> None:
            # NOTE: a caller cancelled before its command ran gets nothing run (and setting a result on its
            # cancelled future would raise InvalidStateError and kill the engine thread).
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:
                future.set_exception(exc)

        self._submit(command)
        return await asyncio.wrap_future(future)

    async def generate(self, req_id: str, add: Callable[[LLMEngine], None]) -> AsyncGenerator[EngineOutput, None]:
        """Submit a request with `add(engine)` (e.g. `engine.add_request(...)`) and stream its outputs.

        Closing the generator early (the caller was cancelled; e.g. under `contextlib.aclosing`) aborts the request
        and frees its KV.
        """
        stream: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        self._streams[req_id] = (asyncio.get_running_loop(), stream)
        finished = False
        try:
            await self.call(add)
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(req_id, None)
            if not finished and self._error is None:
                self.abort(req_id)

    def submit(self, fn: Callable[[LLMEngine], None]) -> None:
        """Queue `fn(engine)` for the engine thread, after every command queued before it; nobody waits for it."""
        self._submit(lambda: fn(self.engine))

    def abort(self, req_id: str) -> None:
        self._submit(lambda: self._dispatch(self.engine.abort_requests([req_id])))

    def release_kv(self, req_id: str) -> None:
        """Queue `engine.release_kv(req_id)` (the request, if still running, finishes normally)."""
        self._submit(lambda: self.engine.release_kv(req_id))

    @property
    def failed(self) -> bool:
        """The engine thread stopped on an error (e.g. a dead worker of a parallel engine): no step runs again."""
        return self._error is not None

    def _submit(self, command: Callable[[], None]) -> None:
        if self._error is not None:
            raise EngineDeadError(f"engine thread failed: {self._error!r}")
        self._commands.put(command)

    def _loop(self) -> None:
        _lower_thread_priority(self._nice)
        try:
            while not self._stopped.is_set():
                if self._run_commands(block=not self.engine.has_unfinished_requests()):
                    self._update()
                if self.engine.has_unfinished_requests():
                    self.step_started_ns = time.time_ns()
                    outputs = self.engine.step()
                    if self._on_step is not None:
                        self._on_step(self.engine, outputs)
                    self._update()
                    self._dispatch(outputs)
        except BaseException as exc:
            logger.exception("engine thread failed")
            self._error = exc
            for loop, stream in list(self._streams.values()):
                loop.call_soon_threadsafe(stream.put_nowait, EngineDeadError(f"engine thread failed: {exc!r}"))

    def _update(self) -> None:
        if self._on_update is not None:
            self._on_update(self.engine)

    def _run_commands(self, block: bool) -> bool:
        """Run the queued commands (waiting a little for one with `block`); False if there was none."""
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return False
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _dispatch(self, outputs: list[EngineOutput]) -> None:
        for output in outputs:
            target = self._streams.get(output.req_id)
            if target is not None:
                loop, stream = target
                loop.call_soon_threadsafe(stream.put_nowait, output)


def _lower_thread_priority(nice: int) -> None:
    """Add `nice` to the calling thread's niceness (Linux: os.nice changes the calling thread only)."""
    if not nice:
        return
    if sys.platform != "linux":
        logger.warning("engine thread niceness %d not applied: niceness is per thread only on Linux", nice)
        return
    logger.info("engine thread niceness %d", os.nice(nice))
