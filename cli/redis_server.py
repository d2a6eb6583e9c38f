"""A throwaway `redis-server` process on 127.0.0.1, for the local cluster CLI and for tests.

No persistence (`--save ''`, `--appendonly no`), its own temporary working directory, a free port
picked at the first start and kept across restarts, so a client's URL stays valid when the server
is stopped mid-run and started again.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

_INSTALL_HINT = "install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`"
_LOG_TAIL_LINES = 20
# NOTE: no persistence at all: a restart starts empty, like a lost Redis in production.
_OPTIONS = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answering_pid(port: int) -> int | None:
    """Process id of the redis-server answering on `port`, or None if none answers yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = b""
            while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    match = re.search(rb"process_id:(\d+)", reply)
    return int(match.group(1)) if match else None


class RedisServer:
    """One `redis-server` child process bound to 127.0.0.1; usable as a context manager."""

    def __init__(self, port: int | None = None, binary: str | None = None, startup_timeout_s: float = 10.0) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError(f"redis-server is not on PATH; {_INSTALL_HINT}")
        self._binary = found
        self._fixed_port = port is not None
        self._port = port if port is not None else _free_port()
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self._port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Launch the server and wait until it answers; raise RuntimeError with its log tail if not."""
        if self.running:
            return
        try:
            self._launch()
        except RuntimeError:
            if self._fixed_port:
                raise
            # NOTE: a port picked by `_free_port` can be taken before redis binds it; retry once.
            self._port = _free_port()
            self._launch()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; removes the working directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def restart(self) -> None:
        """Stop and start again on the same port (the data is gone: nothing is persisted)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers (a 'slow Redis')."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _launch(self) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix="pdserve-redis-"))
        log_path = self._workdir / "redis.log"
        argv = [self._binary, "--port", str(self._port), "--dir", str(self._workdir), *_OPTIONS]
        with log_path.open("wb") as log:
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self._startup_timeout_s
        # NOTE: check the pid: a server already on the port would answer just as well.
        while _answering_pid(self._port) != self._process.pid:
            code = self._process.poll()
            if code is not None or time.monotonic() > deadline:
                what = (
                    f"exited with code {code}"
                    if code is not None
                    else f"did not answer within {self._startup_timeout_s} s"
                )
                tail = log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
                self.stop()
                raise RuntimeError(f"redis-server on port {self._port} {what}; log tail:\n" + "\n".join(tail))
            time.sleep(0.01)

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError("redis-server is not running")
        os.kill(self._process.pid, signum)
