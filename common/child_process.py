"""Child processes that never outlive their parent, however the parent ends (SIGTERM, SIGINT, SIGKILL, a crash).

1. The parent starts the child from a thread that lives as long as the parent: `popen_child` runs every
   `subprocess.Popen` on this process's one spawner thread (`on_spawner_thread`), which lives until the process
   exits; a multiprocessing child is started from the main thread or from the spawner thread.
2. The child, first thing, calls `die_with_parent(parent_pid)`: Linux's parent-death signal (prctl
   PR_SET_PDEATHSIG) is set to SIGKILL, then, if the parent is already gone (it died before the prctl), the child
   kills itself. A `popen_child` command is started through a small Python shim that does that and then execs it
   (the signal survives the exec); a multiprocessing target calls `die_with_parent` on its first line.
3. When the parent dies, the kernel SIGKILLs the child. A child that starts processes of its own does the same for
   them, so a whole tree goes: the launcher's children, their workers, and so on.

NOTE: no `preexec_fn`: Python code between fork and exec in a process with threads (a pod's gRPC threads, a test
process's) runs the interpreter's at-fork handlers in the child, which crashed children (segfaults, aborts in
OpenTelemetry's and logging's fork hooks).
NOTE: the kernel sends the signal when the parent *thread* that forked the child exits, not only when the whole
parent does: a child forked by a short-lived thread (an autoscaler tick, an `asyncio.to_thread` call) would die with
that thread; hence the spawner thread. A set-user-ID program drops the signal at exec (redis-server is none).
Graceful stops (SIGTERM first, a drain, then SIGKILL) stay the parent's business; this is the floor under them.
Elsewhere than on Linux `die_with_parent` does nothing.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent thread dies (linux/prctl.h)."""


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    prctl_fn: Callable[..., int] = prctl
    return prctl_fn


_prctl = _libc_prctl()


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; `parent_pid`: the parent's pid as the parent saw
    it before starting this process (a different `os.getppid()` now means the parent already died: SIGKILL now)."""
    if _prctl is None:
        return
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


_SHIM = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != int(sys.argv[1]):\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Sets the parent-death signal (prctl option 1, PR_SET_PDEATHSIG), dies if the parent is already gone, then execs
the command (argv[2:]) in its place: the command's process keeps the signal (and the shim's pid)."""


def popen_child(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **popen_kwargs)` started from the spawner thread, the child dying with this process
    (through `_SHIM` on Linux)."""
    if _prctl is not None:
        argv = [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *argv]
    return on_spawner_thread(lambda: subprocess.Popen(argv, **popen_kwargs))


def on_spawner_thread(start: Callable[[], T]) -> T:
    """`start()`'s result, run on this process's spawner thread (a daemon thread, started on first use, that lives
    until the process exits); its exception is raised here."""
    return _Spawner.instance().run(start)


class _Spawner:
    """The one thread of this process that starts child processes."""

    _instance: _Spawner | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="pdserve-spawner", daemon=True)
        self._thread.start()

    @classmethod
    def instance(cls) -> _Spawner:
        with cls._instance_lock:
            # NOTE: a forked child (os.fork, not exec) inherits the object but not the thread: start a fresh one.
            if cls._instance is None or not cls._instance._thread.is_alive():
                cls._instance = _Spawner()
            return cls._instance

    def run(self, start: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return start()
        future: Future[T] = Future()
        self._requests.put((start, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            start, future = self._requests.get()
            try:
                future.set_result(start())
            except BaseException as exc:
                future.set_exception(exc)
