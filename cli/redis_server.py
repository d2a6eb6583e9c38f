"""A throwaway `redis-server` process on 127.0.0.1, for the local cluster CLI and for tests.

No persistence (`--save ''`, `--appendonly no`), its own temporary working directory, a free port
picked at the first start and kept across restarts, so a client's URL stays valid when the server
is stopped mid-run and started again. The server dies with the process that started it, however that one ends
(`common.child_process`).

With a `password`, the server requires it (`requirepass`, written to a config file of mode 0600 in its
working directory, never on the command line); with `tls` (`RedisTLS`) it serves TLS only, and `url` is a
`rediss://` URL naming the CA (`common.redis_client`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cli.ports import free_port
from common.child_process import popen_child

_INSTALL_HINT = "install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`"
_LOG_TAIL_LINES = 20
# NOTE: no persistence at all: a restart starts empty, like a lost Redis in production.
_OPTIONS = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")


@dataclass(frozen=True, slots=True)
class RedisTLS:
    """PEM files of a TLS-only Redis: its certificate and key, and the CA its clients verify it against."""

    cert: Path
    key: Path
    ca: Path


def _answering_pid(port: int, password: str | None = None, tls: RedisTLS | None = None) -> int | None:
    """Process id of the redis-server answering on `port`, or None if none answers yet."""
    auth = f"AUTH {password}\r\n".encode() if password else b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as raw:
            sock = (
                raw
                if tls is None
                else ssl.create_default_context(cafile=tls.ca).wrap_socket(raw, server_hostname="127.0.0.1")
            )
            sock.sendall(auth + b"INFO server\r\n")
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

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 10.0,
        password: str | None = None,
        tls: RedisTLS | None = None,
    ) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError(f"redis-server is not on PATH; {_INSTALL_HINT}")
        self._binary = found
        self._fixed_port = port is not None
        self._port = port if port is not None else free_port()
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._password = password
        self._tls = tls

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The URL clients connect with; it carries the password, if any: log `common.redis_client.redact(url)`."""
        auth = f":{self._password}@" if self._password else ""
        if self._tls is None:
            return f"redis://{auth}127.0.0.1:{self._port}/0"
        return f"rediss://{auth}127.0.0.1:{self._port}/0?ssl_ca_certs={self._tls.ca}"

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
            # NOTE: a port picked by `free_port` can be taken before redis binds it; retry once.
            self._port = free_port()
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
        argv = [self._binary, str(self._write_config(self._workdir)), "--dir", str(self._workdir), *_OPTIONS]
        with log_path.open("wb") as log:
            self._process = popen_child(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self._startup_timeout_s
        # NOTE: check the pid: a server already on the port would answer just as well.
        while _answering_pid(self._port, self._password, self._tls) != self._process.pid:
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

    def _write_config(self, workdir: Path) -> Path:
        """The server's config file: its port (TLS only, with `tls`) and password, readable by this user only."""
        lines = [f"port {self._port}"]
        if self._tls is not None:
            tls = self._tls
            lines = [
                "port 0",
                f"tls-port {self._port}",
                f"tls-cert-file {tls.cert}",
                f"tls-key-file {tls.key}",
                f"tls-ca-cert-file {tls.ca}",
                "tls-auth-clients no",
            ]
        if self._password:
            lines.append(f"requirepass {self._password}")
        path = workdir / "redis.conf"
        path.touch(mode=0o600)
        path.write_text("\n".join(lines) + "\n")
        return path

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError("redis-server is not running")
        os.kill(self._process.pid, signum)
