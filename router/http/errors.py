"""pdserve errors as OpenAI-shaped HTTP errors: `{"error": {"message", "type", "param", "code"}}`.

- InvalidArgumentError -> 400 with `param` naming the JSON field (the lifecycle's field names mapped back);
- ResourceExhaustedError -> 429 with `Retry-After` (whole seconds, rounded up, at least 1);
- UnavailableError -> 503 (with `Retry-After` when the error carries a delay);
- UnauthenticatedError -> 401, PermissionDeniedError -> 403;
- a pod's error passed on (RemoteError) -> the HTTP status of its code; anything else -> 500, logged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from google.rpc import status_pb2

from common.errors import InvalidArgumentError, PdserveError, RemoteError
from common.grpc.errors import retry_delay_s

logger = logging.getLogger(__name__)

_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "CANCELLED": 499,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "UNIMPLEMENTED": 501,
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
_FIELD_NAMES = {"text": "prompt", "token_ids": "prompt"}
"""Fields the lifecycle names that the HTTP request calls otherwise (`sampling_params.` prefixes are dropped)."""


@dataclass(slots=True, frozen=True)
class HttpError:
    """An error response: its status, body and headers."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None

    def body(self) -> dict[str, object]:
        error_type = _ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(math.ceil(self.retry_after_s), 1))}


def http_field(field: str) -> str:
    """The JSON field of a lifecycle field name (`sampling_params.max_tokens` -> `max_tokens`, `text` -> `prompt`)."""
    name = field.removeprefix("sampling_params.")
    return _FIELD_NAMES.get(name, name)


def http_error(exc: BaseException) -> HttpError:
    """The HTTP error that reports `exc` (see the module docstring)."""
    if isinstance(exc, InvalidArgumentError):
        field = http_field(exc.field)
        return HttpError(400, f"{field}: {exc.description}", param=field, code=exc.status)
    if isinstance(exc, RemoteError):
        status = _HTTP_STATUS.get(exc.code, 500)
        retry_after_s = retry_delay_s(status_pb2.Status.FromString(exc.rich_status))
        if status == 429 and retry_after_s is None:
            retry_after_s = 1.0
        return HttpError(status, str(exc) or exc.code.lower(), code=exc.code, retry_after_s=retry_after_s)
    if isinstance(exc, PdserveError):
        status = _HTTP_STATUS.get(exc.status, 500)
        if status == 500:
            logger.error("unhandled %s in an HTTP handler", type(exc).__name__, exc_info=exc)
            return HttpError(500, "internal error", code="INTERNAL")
        retry_after_s = exc.retry_after_s
        if exc.status == "RESOURCE_EXHAUSTED" and retry_after_s is None:
            retry_after_s = 1.0
        return HttpError(status, str(exc) or exc.status.lower(), code=exc.status, retry_after_s=retry_after_s)
    logger.error("unhandled %s in an HTTP handler", type(exc).__name__, exc_info=exc)
    return HttpError(500, "internal error", code="INTERNAL")
