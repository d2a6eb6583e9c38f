"""Bearer-token authentication of the public API: `AuthConfig`, the plain `TokenAuthenticator`, and
`AuthInterceptor`, its gRPC server adapter.

A call carries `authorization: Bearer <token>` in its metadata. The authenticator answers, per call:
1. a method exempt from auth (health and reflection, unless `--no-auth-exempt-health`): let through;
2. no `authorization` entry, or one that is not `Bearer <token>`: UnauthenticatedError (UNAUTHENTICATED);
3. a token that is not one of the accepted tokens: PermissionDeniedError (PERMISSION_DENIED);
4. otherwise: let through.
The presented token's SHA-256 is compared with every accepted token's with `hmac.compare_digest`, all of them each
time, so the answer's timing says nothing about which token came close, nor about the tokens' lengths.
Tokens come from `--auth-tokens-file` (one per line; blank lines and `#` comments skipped) and `--auth-tokens` /
`PDSERVE_AUTH_TOKENS` (comma-separated); none given: auth off. Tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from common.config import doc
from common.errors import InvalidArgumentError, PdserveError
from common.grpc.errors import to_status
from common.grpc.handlers import HandlerInterceptor, with_behavior

AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "
EXEMPT_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
"""Services that answer without a token while `auth_exempt_health` is on."""


class UnauthenticatedError(PdserveError):
    """The call carries no bearer token."""

    status = "UNAUTHENTICATED"


class PermissionDeniedError(PdserveError):
    """The call's bearer token is not one of the accepted tokens."""

    status = "PERMISSION_DENIED"


@dataclass(frozen=True, slots=True)
class AuthConfig:
    auth_tokens_file: str | None = field(
        default=None, metadata=doc("file of accepted bearer tokens, one per line (# comments); auth on")
    )
    auth_tokens: str | None = field(
        default=None,
        metadata=doc("accepted bearer tokens, comma-separated; auth on (prefer PDSERVE_AUTH_TOKENS: flags show in ps)"),
    )
    auth_exempt_health: bool = field(default=True, metadata=doc("health and reflection answer without a token"))


def load_tokens(config: AuthConfig) -> tuple[str, ...]:
    """The accepted tokens of `config` (empty: auth off); InvalidArgumentError if the file cannot be read or a
    source is given but holds no token."""
    tokens: list[str] = []
    if config.auth_tokens_file:
        try:
            lines = Path(config.auth_tokens_file).read_text().splitlines()
        except OSError as exc:
            raise InvalidArgumentError(
                "auth_tokens_file", f"cannot read {config.auth_tokens_file}: {exc.strerror}"
            ) from None
        from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not from_file:
            raise InvalidArgumentError("auth_tokens_file", f"{config.auth_tokens_file} holds no token")
        tokens += from_file
    if config.auth_tokens is not None:
        from_list = [token.strip() for token in config.auth_tokens.split(",") if token.strip()]
        if not from_list:
            raise InvalidArgumentError("auth_tokens", "holds no token")
        tokens += from_list
    return tuple(tokens)


class TokenAuthenticator:
    """Decides whether a call may go on; see the module docstring."""

    def __init__(self, tokens: Iterable[str], exempt_services: Sequence[str] = EXEMPT_SERVICES) -> None:
        self._digests = tuple(_digest(token) for token in tokens)
        if not self._digests:
            raise ValueError("no accepted token: leave auth off instead")
        self._exempt_prefixes = tuple(f"/{service}/" for service in exempt_services)

    def check(self, method: str, authorization: str | None) -> None:
        """Return if the call to `method` (`/package.Service/Method`) with this `authorization` value may go on;
        raise UnauthenticatedError or PermissionDeniedError if not."""
        if method.startswith(self._exempt_prefixes):
            return
        if authorization is None or not authorization.startswith(BEARER_PREFIX):
            raise UnauthenticatedError(f"missing bearer token: send metadata '{AUTHORIZATION_KEY}: Bearer <token>'")
        presented = _digest(authorization.removeprefix(BEARER_PREFIX).strip())
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            raise PermissionDeniedError("bearer token not accepted")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def authenticator_for(config: AuthConfig) -> TokenAuthenticator | None:
    """The authenticator `config` asks for; None when no token is configured (auth off)."""
    tokens = load_tokens(config)
    if not tokens:
        return None
    return TokenAuthenticator(tokens, EXEMPT_SERVICES if config.auth_exempt_health else ())


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents `token` (none for None)."""
    return () if token is None else ((AUTHORIZATION_KEY, BEARER_PREFIX + token),)


class AuthInterceptor(HandlerInterceptor):
    """Runs `TokenAuthenticator.check` before each call; a refused call ends with its status and never reaches
    the servicer. Place it before the ErrorInterceptor."""

    def __init__(self, authenticator: TokenAuthenticator) -> None:
        self._authenticator = authenticator

    def intercept_handler(
        self, handler: grpc.RpcMethodHandler[Any, Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        metadata = dict(handler_call_details.invocation_metadata or ())
        authorization = metadata.get(AUTHORIZATION_KEY)
        try:
            self._authenticator.check(
                handler_call_details.method, authorization if isinstance(authorization, str) else None
            )
        except PdserveError as exc:
            return _refusing(handler, to_status(exc))
        return handler


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], status: grpc.Status) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as `handler` that ends every call with `status`."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(status.code, status.details, status.trailing_metadata)

    return with_behavior(handler, refuse)
