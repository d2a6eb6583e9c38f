"""`ComposeConnector`: the autoscaler scaling the `prefill` and `decode` services of a compose project through the
compose CLI (`docker compose`, `docker-compose` or `podman compose`, on the engine's socket: DOCKER_HOST).

Each change is one command, `COMPOSE [-f FILE] [-p PROJECT] up -d --no-deps --no-recreate --scale ROLE=N ROLE`,
run on a worker thread of the role; the role is `pending` until it returns. `N` is the decision's `desired` count.
- Scale-out: compose creates and starts the next-numbered container; the command returns once it runs, and the
  planner holds the role until the registry shows the new pod (it registers when its model is loaded).
- Scale-in drains through SIGTERM and the service's `stop_grace_period`: compose picks the container itself (the
  highest-numbered; docker-compose 1.29 sorts the running containers by their number and stops those past N),
  stops it with SIGTERM, waits up to `stop_grace_period` (45 s in docker-compose.yml, over the pods' 30 s
  --drain-timeout-s) and only then kills and removes it. On SIGTERM the pod reports NOT_SERVING and draining, the
  router stops routing to it, its in-flight requests finish, its KV is released, it deregisters and exits 0;
  the command returns once the container is gone.
  NOTE: why not drain `pod_to_drain` (the least loaded pod) first, as the local connector does: compose would still
  remove the highest-numbered container, a different pod, and no CLI option names the replica to remove; asking
  one container to exit first leaves a stopped container that `up --scale` counts and starts again. SIGTERM is
  the pods' one drain contract, the one Kubernetes' preStop and terminationGracePeriodSeconds use too.
A command that fails is logged with its output; the planner moves on after `action_timeout_s`.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from autoscaler.config import ComposeConfig
from autoscaler.planner import Decision
from common.errors import InvalidArgumentError
from common.pod_registry import PodInfo, PodRole

logger = logging.getLogger(__name__)

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]
"""Runs argv with a timeout in seconds and returns its exit code and output (`run_command`; a fake in tests)."""

Which = Callable[[str], str | None]
"""Finds an executable on PATH (`shutil.which`)."""

CANDIDATES: tuple[tuple[str, ...], ...] = (
    ("docker", "compose"),
    ("docker-compose",),
    ("podman", "compose"),
    ("podman-compose",),
)
"""The compose CLIs tried in order when --compose-command is empty."""
_PROBE_TIMEOUT_S = 30.0
_OUTPUT_TAIL_CHARS = 2000


def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run `argv` (no shell), its stdout and stderr together; a timeout counts as exit code 124."""
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        return subprocess.CompletedProcess(list(argv), 124, output + f"\n(timed out after {timeout_s:g} s)")


def find_compose_command(configured: str, which: Which = shutil.which, run: Runner = run_command) -> list[str]:
    """The compose CLI: --compose-command shell-split, else the first of `CANDIDATES` that is installed (a plugin
    form, `docker compose`, must also answer `version`); raises InvalidArgumentError naming the flag if none is."""
    if configured.strip():
        return shlex.split(configured)
    for candidate in CANDIDATES:
        if which(candidate[0]) is None:
            continue
        if len(candidate) == 1 or run([*candidate, "version"], _PROBE_TIMEOUT_S).returncode == 0:
            return list(candidate)
    tried = ", ".join(" ".join(c) for c in CANDIDATES)
    raise InvalidArgumentError("compose_command", f"--compose-command: no compose CLI found (tried {tried})")


class ComposeConnector:
    """Scales the compose services named after the roles; one command at a time per role."""

    def __init__(self, config: ComposeConfig, command: Sequence[str], run: Runner = run_command) -> None:
        self._base = [*command]
        self._base += ["-f", config.compose_file] if config.compose_file else []
        self._base += ["-p", config.compose_project] if config.compose_project else []
        self._timeout_s = config.compose_timeout_s
        self._run = run
        self._workers = ThreadPoolExecutor(2, thread_name_prefix="pdserve-autoscaler-compose")
        self._lock = threading.Lock()
        self._running: dict[PodRole, Future[bool]] = {}

    def scale_argv(self, role: PodRole, num_pods: int) -> list[str]:
        """The command that brings service `role` to `num_pods` containers."""
        return [*self._base, "up", "-d", "--no-deps", "--no-recreate", "--scale", f"{role}={num_pods}", role]

    def pending(self) -> frozenset[PodRole]:
        with self._lock:
            return frozenset(role for role, future in self._running.items() if not future.done())

    def scale(self, decision: Decision, pods: Sequence[PodInfo]) -> None:
        role = decision.role
        with self._lock:
            if role in self._running and not self._running[role].done():
                logger.warning("autoscaler: compose is still scaling %s; ignoring %s", role, decision)
                return
            argv = self.scale_argv(role, decision.desired)
            self._running[role] = self._workers.submit(self._apply, argv)
        logger.info(
            "autoscaler: %s %s to %d: %s",
            "adding" if decision.direction == "up" else "draining",
            role,
            decision.desired,
            shlex.join(argv),
        )

    def close(self) -> None:
        """Start no more commands; one in flight runs to its end (a drain is not cut short: the process exits once
        it has returned)."""
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _apply(self, argv: list[str]) -> bool:
        result = self._run(argv, self._timeout_s)
        if result.returncode != 0:
            logger.error(
                "autoscaler: %s exited with %d:\n%s",
                shlex.join(argv),
                result.returncode,
                (result.stdout or "")[-_OUTPUT_TAIL_CHARS:],
            )
            return False
        logger.info("autoscaler: done: %s", shlex.join(argv))
        return True
