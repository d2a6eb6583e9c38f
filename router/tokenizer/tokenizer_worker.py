"""The router's end of one tokenizer worker process (see router.tokenizer.tokenizer_pool): a socket carrying pickled
(id, op, arg) requests out and (id, status, value) replies back, in order, with the requests still outstanding.

NOTE: the worker writes with multiprocessing.Connection.send_bytes, whose frames (< 2 GiB) are a 4-byte big-endian
length and the payload; the event loop reads and writes those frames on the socket directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import struct
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

from common.errors import UnavailableError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!i")
"""Frame header of multiprocessing.Connection.send_bytes (the worker's side) for frames < 2 GiB."""
OK, INVALID, ERROR = "ok", "invalid", "error"
"""Statuses of a reply: its value is the result, the chat template's complaint, or the failure."""
_JOIN_TIMEOUT_S = 5.0


class TokenizerWorker:
    """The router's end of one worker process: its socket and its outstanding requests."""

    def __init__(
        self,
        process: BaseProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_exit: Callable[[TokenizerWorker], None],
    ) -> None:
        self.process = process
        self._on_exit = on_exit
        self._reader = reader
        self._writer = writer
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._last_reply_at = 0.0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def alive(self) -> bool:
        return self._read_task is not None and not self._read_task.done()

    async def wait_ready(self) -> int:
        """The worker's pid once it has loaded the tokenizer; then start reading replies."""
        _, status, value = await self._read_frame()
        if status != OK:
            raise RuntimeError(value)
        self._read_task = asyncio.create_task(self._read_replies(), name=f"tokenizer-worker-{value}")
        return int(value)

    async def call(self, op: str, arg: Any) -> tuple[str, Any, float]:
        """(status, value, queue time in s) of one operation on the worker."""
        if not self.alive:
            raise UnavailableError("tokenizer worker is gone")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            data = pickle.dumps((request_id, op, arg), protocol=pickle.HIGHEST_PROTOCOL)
            sent_at = time.perf_counter()
            try:
                self._writer.write(_HEADER.pack(len(data)) + data)
                await self._writer.drain()
            except ConnectionError as exc:
                # NOTE: the worker died and its reader has not seen the end of the pipe yet.
                raise UnavailableError("tokenizer worker died; retry") from exc
            status, value, previous_reply_at = await future
        finally:
            self._pending.pop(request_id, None)
        # NOTE: the worker answers in order, so it started this request when it sent the previous reply.
        return status, value, max(previous_reply_at - sent_at, 0.0)

    async def aclose(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
            await asyncio.gather(self._read_task, return_exceptions=True)
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        await asyncio.to_thread(self.process.join, _JOIN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()

    async def _read_frame(self) -> tuple[int, str, Any]:
        (size,) = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
        frame: tuple[int, str, Any] = pickle.loads(await self._reader.readexactly(size))
        return frame

    async def _read_replies(self) -> None:
        try:
            while True:
                request_id, status, value = await self._read_frame()
                future = self._pending.get(request_id)
                if future is not None and not future.done():
                    future.set_result((status, value, self._last_reply_at))
                self._last_reply_at = time.perf_counter()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            logger.error(
                "tokenizer worker %s exited (%r); %d requests failed", self.process.pid, exc, len(self._pending)
            )
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(UnavailableError("tokenizer worker died; retry"))
            self._on_exit(self)
