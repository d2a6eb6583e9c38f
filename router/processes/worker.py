"""`python -m router.processes.worker <run folder> <index>`: one of the processes of `pdserve router --workers N`,
started by router.processes.supervisor (never by hand).

1. It asks the kernel for SIGKILL when its parent goes (PR_SET_PDEATHSIG), and exits at once if the parent already
   went, so that no worker outlives the supervisor, however the supervisor ends.
2. It reads the router's configs from the run folder (`WorkerSpec`): the ports every worker binds.
3. It serves as a lone router does (router.__main__.serve), as process `index` of N (router.processes.router_process):
   its serving line tells the supervisor it is up; SIGTERM drains it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from common.child_process import die_with_parent
from router.__main__ import serve
from router.processes.router_process import RouterProcess
from router.processes.supervisor import WorkerSpec


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
