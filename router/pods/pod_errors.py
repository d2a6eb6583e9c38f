"""A pod's failed call (or a failed request on a DecodeStream) as the typed error the router's core acts on.

Classified once, here at the boundary, so the core never sees gRPC:
- UNAVAILABLE -> UnavailableError (the pod is gone, draining, or its keepalive lapsed; try another);
- RESOURCE_EXHAUSTED -> ResourceExhaustedError (no KV blocks there, or overloaded; its RetryInfo kept);
- INVALID_ARGUMENT with a BadRequest -> InvalidArgumentError naming the same field (reported under its public path);
- ABORTED / NOT_FOUND / FAILED_PRECONDITION (a KV transfer or reservation that ended, e.g. its lease lapsed) and
  UNKNOWN / CANCELLED (the peer went away mid-call) -> `PodCallFailed`, which another pair of pods could fix;
- anything else -> RemoteError, passed on to the router's client with the pod's status and details.
"""

from __future__ import annotations

import grpc.aio
from google.rpc import code_pb2, status_pb2

from common.errors import InvalidArgumentError, RemoteError, ResourceExhaustedError, UnavailableError
from common.grpc.errors import bad_request_fields, call_status, retry_delay_s

_TRANSFER_CODES = frozenset({code_pb2.ABORTED, code_pb2.NOT_FOUND, code_pb2.FAILED_PRECONDITION})
_PEER_GONE_CODES = frozenset({code_pb2.UNKNOWN, code_pb2.CANCELLED})


class PodCallFailed(Exception):
    """A pod call failed in a way another pair of pods could fix; `transfer`: the failure is a KV transfer's (the
    transfer's other end may be the one to blame)."""

    def __init__(self, pod_id: str, message: str, transfer: bool) -> None:
        super().__init__(message)
        self.pod_id = pod_id
        self.transfer = transfer


def pod_error(pod_id: str, rpc: str, status: status_pb2.Status) -> Exception:
    """The typed error of a pod's status (see the module docstring); `rpc` names the call, for the message."""
    message = f"{rpc} on pod {pod_id}: {status.message}"
    code = status.code
    if code == code_pb2.UNAVAILABLE:
        return UnavailableError(message)
    if code == code_pb2.RESOURCE_EXHAUSTED:
        return ResourceExhaustedError(message, retry_delay_s(status))
    violations = bad_request_fields(status) if code == code_pb2.INVALID_ARGUMENT else []
    if violations:
        # NOTE: re-raised so that the router's interceptor reports the public field path (a pod may name the
        # engine's field, e.g. Reserve's top-level max_tokens).
        return InvalidArgumentError(*violations[0])
    if code in _TRANSFER_CODES or code in _PEER_GONE_CODES:
        name = code_pb2.Code.Name(code)
        return PodCallFailed(pod_id, f"pod {pod_id}: {name}: {status.message}", code in _TRANSFER_CODES)
    return RemoteError(code_pb2.Code.Name(code), status.message, status.SerializeToString())


def rpc_error(pod_id: str, rpc: str, error: grpc.aio.AioRpcError) -> Exception:
    """The typed error of a failed call to a pod."""
    return pod_error(pod_id, rpc, call_status(error))
