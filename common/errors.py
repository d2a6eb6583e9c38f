"""Errors shared by every layer; the gRPC boundary maps them to status codes."""

from __future__ import annotations


class PdserveError(Exception):
    """Base class of pdserve's own errors."""


class InvalidArgumentError(PdserveError, ValueError):
    """Bad input from a caller. `field` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.description = message


class ResourceExhaustedError(PdserveError):
    """The service is overloaded or out of KV blocks for now; retry later."""


class UnavailableError(PdserveError):
    """No healthy pod (or peer) can take the request."""
