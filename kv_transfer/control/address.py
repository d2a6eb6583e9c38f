"""The tcp backend's endpoints: "host:port", with IPv6 hosts in brackets ("[::1]:7000")."""

from __future__ import annotations

from common.errors import InvalidArgumentError


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError("endpoint", f"must be host:port, got {endpoint!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)
