"""Generate calls over HTTP, in the request's own task, so that a disconnect or an Abort cancels them.

1. `DisconnectWatcher` reads the connection's ASGI messages beside the handler; `http.disconnect` cancels the
   handler's task, whose CancelledError closes the lifecycle's stream (every pod call, the request's KV).
   It is stopped before the response ends (uvicorn answers `http.disconnect` once a response is complete).
2. The handler awaits the first chunk before answering, so that refusals (400, 429, 503) get their status.
3. `SseResponse` streams the rest in the same task as server-sent events (`data: {...}`), one event per chunk,
   then the usage chunk when asked, then `data: [DONE]`. An Abort mid-stream ends it with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.http.errors import HttpError, http_error
from router.http.protocol import CompletionBodies
from router.outputs import CompletionChunk, Usage

DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class DisconnectWatcher:
    """Cancels the task that made it when the client disconnects, until `stop`."""

    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        owner = asyncio.current_task()
        assert owner is not None
        self._owner = owner
        self._task = asyncio.create_task(self._watch(receive), name="http-disconnect-watch")

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self._owner.cancel()

    def stop(self) -> None:
        self._task.cancel()

    def absorb(self) -> bool:
        """In an `except CancelledError`: True (and the cancellation undone) when it came from a disconnect or an
        Abort rather than from the server stopping (the task then holds more than one cancel request)."""
        self.stop()
        if self._owner.cancelling() > 1:
            return False
        self._owner.uncancel()
        return True


class SseResponse(Response):
    """A Generate stream as server-sent events; see the module docstring."""

    def __init__(
        self,
        first: CompletionChunk,
        chunks: AsyncGenerator[CompletionChunk, None],
        bodies: CompletionBodies,
        watcher: DisconnectWatcher,
        include_usage: bool,
        headers: dict[str, str],
    ) -> None:
        # NOTE: no Response.__init__: it renders an empty body and would announce content-length 0.
        self.status_code = 200
        self.media_type = "text/event-stream"
        self.background = None
        self.init_headers({**headers, "Cache-Control": "no-cache"})
        self._first = first
        self._chunks = chunks
        self._bodies = bodies
        self._watcher = watcher
        self._include_usage = include_usage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        tail = DONE_EVENT
        try:
            usage = await self._send_chunks(send)
            if usage is not None and self._include_usage:
                tail = sse_event(self._bodies.usage_chunk(usage)) + DONE_EVENT
        except asyncio.CancelledError:
            if not self._watcher.absorb():
                raise
            if self._watcher.disconnected:
                return
            tail = sse_event(HttpError(499, "request aborted", code="CANCELLED").body()) + DONE_EVENT
        except Exception as exc:
            tail = sse_event(http_error(exc).body()) + DONE_EVENT
        finally:
            self._watcher.stop()
            await self._chunks.aclose()
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _send_chunks(self, send: Send) -> Usage | None:
        started: set[int] = set()
        chunk: CompletionChunk | None = self._first
        usage = None
        async with contextlib.aclosing(self._chunks) as rest:
            while chunk is not None:
                # NOTE: a chunk with no text (a multi-byte character still incomplete) is sent only when it ends
                # the completion; chat announces the role once per completion.
                if chunk.text or chunk.finish_reason is not None or chunk.index not in started:
                    body = self._bodies.chunk(chunk, chunk.index not in started, self._include_usage)
                    started.add(chunk.index)
                    await send({"type": "http.response.body", "body": sse_event(body), "more_body": True})
                usage = chunk.usage or usage
                chunk = await anext(rest, None)
        return usage
