"""The engine core process of a pod: `python -m engine.core --fd N` (`main`), started by the pod.

1. It dies with its pod (the pod starts it with a parent-death signal, and it stops when the pod's end of the socket
   closes), reads its `CoreSpec` (the first message on the socket), loads the engine and opens the role's KV transfer
   end (a decode pod's receiver, a prefill pod's sender) beside the pool; then it answers `CoreReady` (or
   `CoreFailed`, and exits 1).
2. Its loop, on the process's main thread, never waits for the pod: a reader thread puts the pod's commands into
   the loop's inbox (the KV backend's hooks wake it too); each turn applies every command that arrived, runs one
   engine step when a request is unfinished, and sends the turn's `CoreOutputs` back (a turn with nothing new sends
   nothing). With nothing to step it blocks on the inbox (polling every millisecond while a decode request waits for
   its transfer).
3. `Shutdown`, or the pod's end closing: the KV end is closed (live transfers end ABORTED) and the process exits 0.
   An error in a turn is logged and reported as `CoreFailed`; the process exits 1 and the pod sees its engine dead.
"""

from __future__ import annotations

import argparse
import logging
import queue
import socket
import sys
import threading
from collections.abc import Callable, Sequence

from common.tls import kv_client_context, kv_server_context
from engine.core.channel import encode, read_message
from engine.core.engine_core import EngineCore
from engine.core.messages import CoreFailed, CoreReady, CoreSpec
from engine.core.outputs import CoreOutputs, EngineLoad
from engine.llm_engine import LLMEngine
from kv_transfer.factory import make_pod_receiver, make_pod_sender

logger = logging.getLogger("engine.core")

_TRANSFER_POLL_S = 0.001
_EOF = object()
_WAKE = object()


def open_core(spec: CoreSpec, wake: Callable[[], None]) -> tuple[EngineCore, CoreReady]:
    """Load the engine, open the role's KV end, and make the core (`wake`: EngineCore's)."""
    engine = LLMEngine(spec.engine)
    views = engine.kv_pool_views()
    if spec.role == "colocated":
        core = EngineCore(engine, wake=wake)
        return core, CoreReady(engine.info, engine.scheduler.config, "", None, core.load())
    if spec.role == "decode":
        receiver = make_pod_receiver(
            spec.kv_transfer_backend,
            views,
            spec.kv_host,
            spec.kv_port,
            advertise_host=spec.kv_advertise_host,
            ssl_context=kv_server_context(spec.tls),
        )
        core = EngineCore(engine, receiver=receiver, wake=wake)
        endpoint, layout = receiver.endpoint, receiver.layout
    else:
        sender = make_pod_sender(
            spec.kv_transfer_backend,
            views,
            lease_s=spec.kv_lease_s,
            connect_timeout_s=spec.kv_connect_timeout_s,
            ssl_context=kv_client_context(spec.tls),
        )
        core = EngineCore(engine, sender=sender, wake=wake)
        endpoint, layout = "", sender.layout
    return core, CoreReady(engine.info, engine.scheduler.config, endpoint, layout, core.load())


class CoreLoop:
    """The loop of step 2 (see the module docstring) over one end of the pod's socket pair."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._last_load: EngineLoad | None = None

    def run(self, spec: CoreSpec) -> int:
        """Start, serve until Shutdown or the pod's end closes; the exit code."""
        try:
            core, ready = open_core(spec, lambda: self._inbox.put(_WAKE))
        except Exception as exc:
            logger.exception("the engine core could not start")
            self._send(CoreFailed(f"{type(exc).__name__}: {exc}"))
            return 1
        self._send(ready)
        threading.Thread(target=self._read, name="core-reader", daemon=True).start()
        try:
            self._serve(core)
        except Exception as exc:
            logger.exception("the engine core failed")
            self._send(CoreFailed(f"{type(exc).__name__}: {exc}"))
            return 1
        finally:
            core.close()
        return 0

    def _serve(self, core: EngineCore) -> None:
        while not core.stopped:
            if self._take_commands(core):
                return
            self._send_outputs(core.turn())

    def _take_commands(self, core: EngineCore) -> bool:
        """Apply every command that arrived (waiting for one when nothing else is to do); True once the pod's end
        closed."""
        if core.engine.has_unfinished_requests():
            timeout: float | None = 0.0
        else:
            timeout = _TRANSFER_POLL_S if core.busy else None
        try:
            item = self._inbox.get(timeout=timeout) if timeout != 0.0 else self._inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            if item is _EOF:
                return True
            if item is not _WAKE:
                core.apply(item)  # type: ignore[arg-type]
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return False

    def _send_outputs(self, out: CoreOutputs) -> None:
        """Send a turn's outputs unless it brought nothing new."""
        new = (
            out.step_started_ns
            or out.replies
            or out.failures
            or out.outputs
            or out.transfers_ended
            or out.reservations_ended
            or out.load != self._last_load
        )
        if new:
            self._last_load = out.load
            self._send(out)

    def _send(self, message: object) -> None:
        self._sock.sendall(encode(message))

    def _read(self) -> None:
        """Reader thread: the pod's commands into the inbox, then _EOF once its end closed."""
        try:
            while (message := read_message(self._sock)) is not None:
                self._inbox.put(message)
        except OSError:
            pass
        self._inbox.put(_EOF)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.core", description="A pod's engine core process.")
    parser.add_argument("--fd", type=int, required=True, help="this process's end of the pod's socket pair")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = socket.socket(fileno=args.fd)
    spec = read_message(sock)
    if not isinstance(spec, CoreSpec):
        logger.error("expected a CoreSpec first, got %r", type(spec).__name__)
        return 2
    return CoreLoop(sock).run(spec)
