"""EngineCoreClient: a pod's side of its engine core process, on the pod's event loop.

1. `start()` starts `python -m engine.core` with one end of a socket pair, sends it the `CoreSpec` and waits
   for `CoreReady` (the engine loaded; the pod's health says NOT_SERVING meanwhile). A core that fails to start
   raises EngineDeadError here.
2. `attach(on_outputs, on_dead)` names who takes the core's messages (the pod's front, built from `CoreReady`);
   `send(command)` queues a command on the socket (never blocks); every turn's `CoreOutputs` is handed to
   `on_outputs` on the event loop, in order.
3. The core dying (its process exits, or it reports `CoreFailed`) is seen at once: `failed` turns True and `on_dead`
   is called once, so the pod fails its open calls (they migrate through the router) and leaves routing.
4. `close()` asks the core to shut down (it aborts its live transfers), waits for it, and kills it if it lingers.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable

from common.child_process import popen_child
from common.errors import UnavailableError
from engine.core.channel import FrameDecoder, encode, socket_pair
from engine.core.commands import Command, Shutdown
from engine.core.messages import CoreFailed, CoreReady, CoreSpec
from engine.core.outputs import CoreOutputs

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 10.0


class EngineDeadError(UnavailableError):
    """The engine core stopped (its process died or a step failed): no request can make progress on this pod. NOTE:
    UNAVAILABLE at the pod's gRPC boundary, so the router migrates the pod's in-flight requests."""


def _ignore(message: object) -> None:
    """Before `attach`: the core sends no outputs until it is sent commands."""


class EngineCoreClient:
    """See the module docstring."""

    def __init__(self, spec: CoreSpec) -> None:
        self._spec = spec
        self._on_outputs: Callable[[CoreOutputs], None] = _ignore
        self._on_dead: Callable[[EngineDeadError], None] = _ignore
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ready: asyncio.Future[CoreReady] | None = None
        self._closing = False
        self.error: EngineDeadError | None = None
        """Why the core is dead; None while it lives."""

    @property
    def failed(self) -> bool:
        return self.error is not None

    async def start(self) -> CoreReady:
        """Start the core process and wait until its engine has loaded; EngineDeadError if it cannot start."""
        loop = asyncio.get_running_loop()
        pod_end, core_end = socket_pair()
        # NOTE: popen_child: the core dies with the pod, whatever kills it.
        self._process = popen_child(
            [sys.executable, "-m", "engine.core", "--fd", str(core_end.fileno())], pass_fds=(core_end.fileno(),)
        )
        core_end.close()
        self._ready = loop.create_future()
        self._transport, _ = await loop.create_unix_connection(lambda: _CoreProtocol(self), sock=pod_end)
        self._transport.write(encode(self._spec))
        return await self._ready

    def attach(self, on_outputs: Callable[[CoreOutputs], None], on_dead: Callable[[EngineDeadError], None]) -> None:
        """From now on, each turn's outputs go to `on_outputs` and the core's death to `on_dead` (on the event loop)."""
        self._on_outputs = on_outputs
        self._on_dead = on_dead

    def send(self, command: Command) -> None:
        """Queue `command` for the core; EngineDeadError once it is dead."""
        if self.error is not None:
            raise self.error
        assert self._transport is not None, "start() first"
        self._transport.write(encode(command))

    async def close(self) -> None:
        """Shut the core down (its live transfers end ABORTED); kill it if it does not exit in time."""
        process = self._process
        if process is None:
            return
        self._closing = True
        if self.error is None and self._transport is not None:
            self._transport.write(encode(Shutdown()))
        try:
            await asyncio.to_thread(process.wait, _CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the engine core did not exit within %.0f s; killing it", _CLOSE_TIMEOUT_S)
            process.kill()
            await asyncio.to_thread(process.wait)
        if self._transport is not None:
            self._transport.close()

    def _received(self, data: bytes) -> None:
        for message in self._decoder.feed(data):
            if isinstance(message, CoreOutputs):
                self._on_outputs(message)
            elif isinstance(message, CoreReady):
                assert self._ready is not None
                self._ready.set_result(message)
            elif isinstance(message, CoreFailed):
                self._died(f"the engine core failed: {message.message}")

    def _died(self, reason: str) -> None:
        if self.error is not None:
            return
        self.error = EngineDeadError(reason)
        if self._closing:
            return
        logger.error("%s", reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(self.error)
        else:
            self._on_dead(self.error)


class _CoreProtocol(asyncio.Protocol):
    def __init__(self, client: EngineCoreClient) -> None:
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client._died("the engine core process exited" if exc is None else f"the engine core's socket: {exc}")
