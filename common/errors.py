"""Errors shared by every layer; the gRPC boundary maps them to status codes (`common.grpc.errors`).

Each class names its status as a `google.rpc.Code` name (`status`), so the one error interceptor reports any of them
without knowing the class, and this module stays free of gRPC.
"""

from __future__ import annotations

from typing import ClassVar


class PdserveError(Exception):
    """Base class of pdserve's own errors."""

    status: ClassVar[str] = "INTERNAL"
    """The google.rpc.Code name that reports this error to a gRPC caller."""
    retry_after_s: float | None = None
    """When set, how long the caller should wait before retrying (reported as a google.rpc.RetryInfo)."""


class InvalidArgumentError(PdserveError, ValueError):
    """Bad input from a caller. `field` names the offending field (dotted path)."""

    status = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.description = message


class ResourceExhaustedError(PdserveError):
    """The service is overloaded or out of KV blocks for now; retry after `retry_after_s` (None: the default)."""

    status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(PdserveError):
    """No healthy pod (or peer) can take the request; `retry_after_s`, when set, is the delay the caller is told
    to wait before retrying (a google.rpc.RetryInfo at the gRPC boundary)."""

    status = "UNAVAILABLE"

    def __init__(self, message: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RemoteError(PdserveError):
    """An error another service answered with, passed on to the caller as it came: `code` is its google.rpc.Code
    name, `rich_status` the serialized google.rpc.Status with its details (b"" when it had none)."""

    def __init__(self, code: str, message: str, rich_status: bytes = b"") -> None:
        super().__init__(message)
        self.code = code
        self.rich_status = rich_status
