"""How a launcher (`pdserve up`, `pdserve bench`) stops its children when it is told to stop.

1. While the launcher runs, SIGINT and SIGTERM raise KeyboardInterrupt in its main thread (SIGINT too: a shell that
   starts the launcher in the background, without job control, leaves SIGINT ignored).
2. On the way out, whatever the reason (the signal, an error, the end of the work), both signals are ignored while
   `stop` stops the children gracefully (the router first, the pods drain, Redis last): a second Ctrl-C must not cut
   that short.
3. The previous handlers come back.

SIGKILL and crashes cannot be handled: there the children's parent-death signal (`common.child_process`) stops them.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopping_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Run the block with SIGINT and SIGTERM raising KeyboardInterrupt, then `stop()` with both ignored. Call it
    from the main thread."""
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupt)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        try:
            stop()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
