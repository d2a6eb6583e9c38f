"""Local ports: a free one to bind, and the host a local client dials for a server's bind host."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def connect_host(bind_host: str) -> str:
    """The host a local client connects to for a server bound to `bind_host`."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host
