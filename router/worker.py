"""`python -m router.worker <run folder> <index>`: one of the processes of `pdserve router --workers N`, started by
router.supervisor (never by hand).

1. It asks the kernel for SIGKILL when its parent goes (PR_SET_PDEATHSIG), and exits at once if the parent already
   went, so that no worker outlives the supervisor, however the supervisor ends.
2. It reads the router's configs from the run folder (`WorkerSpec`): the ports every worker binds.
3. It serves as a lone router does (router.__main__.serve), as process `index` of N (router.router_process): its
   serving line tells the supervisor it is up; SIGTERM drains it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from router.__main__ import serve
from router.router_process import RouterProcess
from router.supervisor import WorkerSpec

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent exits; exit now if its parent is no longer `parent_pid`.

    NOTE: the kernel sends the signal when the parent *thread* that started this process exits: the supervisor
    starts its workers from its main thread, which lives as long as it does.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        sys.exit(f"router worker: the supervisor (pid {parent_pid}) is gone")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: `argv` is [run folder, index]."""
    run_dir, index = (sys.argv[1:] if argv is None else argv)[:2]
    spec = WorkerSpec.read(Path(run_dir))
    die_with_parent(spec.supervisor_pid)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s %(levelname)s %(name)s[{index}]: %(message)s"
    )
    process = RouterProcess(int(index), spec.num_workers, Path(run_dir))
    uvloop.run(serve(spec.config, spec.routing, spec.telemetry, spec.security, process))
    return 0


if __name__ == "__main__":
    sys.exit(main())
