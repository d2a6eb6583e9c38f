"""One child process of a local pdserve cluster: `ServiceProcess`, and `ClusterError` for one that fails.

The process runs in a session of its own, dies with the process that started it (`common.child_process`: a
SIGKILL of the launcher takes it along) and logs stdout and stderr to its own file; `wait_serving` waits until it
reports SERVING on grpc.health.v1, or raises `ClusterError` with its log tail if it exits first.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.child_process import popen_child
from common.grpc.server import wait_for_health
from common.tls import ChannelSecurity

logger = logging.getLogger(__name__)

POLL_S = 0.1
"""How often startup waits look at a process or the registry again."""
LOG_TAIL_LINES = 30


class ClusterError(RuntimeError):
    """A cluster process failed to start or exited; the message carries its log tail."""


class ServiceProcess:
    """One child process of the cluster; stdout and stderr go to its own log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        address: str,
        log_path: Path,
        env: Mapping[str, str],
        metrics_url: str | None = None,
        security: ChannelSecurity | None = None,
    ) -> None:
        self.name = name
        self._security = security
        self.address = address
        """host:port of its gRPC server."""
        self.metrics_url = metrics_url
        """http://host:port/metrics of its Prometheus endpoint; None when it serves none."""
        self.log_path = log_path
        with log_path.open("ab") as log:
            # NOTE: a session of its own, so a Ctrl-C in the terminal reaches only the CLI, which then
            # stops the children in order (router first, Redis last) instead of all at once.
            self._popen: subprocess.Popen[bytes] = popen_child(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return self._popen.poll()

    def send_signal(self, sig: signal.Signals) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(sig)

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for it to exit, then SIGKILL it; its exit code."""
        try:
            return self._popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not exit within %.1f s; killing it", self.name, timeout_s)
            self._popen.kill()
            return self._popen.wait()

    def log_tail(self, num_lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    async def wait_serving(self, timeout_s: float) -> None:
        """Wait for SERVING; raise ClusterError (with the log tail) if the process exits or times out first."""
        health = asyncio.ensure_future(wait_for_health(self.address, timeout_s, self._security))
        try:
            while not health.done():
                if self.returncode is not None:
                    raise ClusterError(
                        f"{self.name} exited with code {self.returncode} while starting; "
                        f"log tail ({self.log_path}):\n{self.log_tail()}"
                    )
                await asyncio.wait([health], timeout=POLL_S)
            health.result()
        except TimeoutError as exc:
            raise ClusterError(f"{exc}; log tail of {self.name} ({self.log_path}):\n{self.log_tail()}") from exc
        finally:
            health.cancel()
