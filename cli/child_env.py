"""The environment of the local cluster's processes.

`PDSERVE_*` variables reach every process, and the cluster's own flags win over them (each such variable is
logged once as ignored). Settings that must differ per process never come from the environment: their variables
are dropped, so a decode pod's KV port stays a free one and, with metrics off, no process binds a /metrics port.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from common.config import env_name

logger = logging.getLogger(__name__)

PER_PROCESS_VARIABLES = tuple(env_name(dest) for dest in ("port", "pod_id", "kv_port", "metrics_port"))
"""Variables of settings that must differ between the cluster's processes: never inherited."""


class ChildEnvironment:
    """Builds each process's environment from this one's, the cluster's `extra` variables and its pod count."""

    def __init__(self, extra: Mapping[str, str], num_pods: int) -> None:
        self._extra = dict(extra)
        self._num_pods = max(1, num_pods)
        self._warned: set[str] = set()

    def for_process(self, cluster_args: Sequence[str]) -> dict[str, str]:
        """The environment of a process the cluster starts with its own flags `cluster_args`."""
        inherited = {name: value for name, value in os.environ.items() if name not in PER_PROCESS_VARIABLES}
        env = {**inherited, **self._extra, "PYTHONUNBUFFERED": "1"}
        # NOTE: pods on a shared CPU fight over cores; one torch thread pool per pod sized to its share
        # runs faster than every pod spinning up a thread per core. An explicit OMP_NUM_THREADS wins.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self._num_pods)))
        self._warn_overridden(cluster_args, env)
        return env

    def _warn_overridden(self, cluster_args: Sequence[str], env: Mapping[str, str]) -> None:
        """Log once per variable that one of the cluster's own flags overrides."""
        for flag in (arg for arg in cluster_args if arg.startswith("--")):
            name = env_name(flag.removeprefix("--").replace("-", "_"))
            if name in env and name not in self._warned:
                self._warned.add(name)
                logger.warning("%s is ignored: the cluster passes its processes %s (flags win)", name, flag)
