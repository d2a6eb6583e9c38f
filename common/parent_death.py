"""A child process that must not outlive its parent asks the kernel to kill it when the parent dies (Linux)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Have `signum` sent to this process when its parent dies; exit at once if `parent_pid` is already gone (it
    died before the request took effect). NOTE: the kernel ties it to the parent *thread* that forked this process:
    start such children from a thread that lives as long as the parent (its main thread or event loop)."""
    if sys.platform != "linux":
        logger.warning("this process may outlive its parent: the parent-death signal is Linux-only")
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)
