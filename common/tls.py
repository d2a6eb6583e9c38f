"""TLS on the public port and mutual TLS on the internal planes, from PEM files named in config.

- `PublicTLSConfig` (the router): `--tls-cert` and `--tls-key` serve the public port over TLS. Clients verify the
  router's certificate; none of theirs is asked for (the public API authenticates with bearer tokens,
  `common.auth`).
- `ClusterTLSConfig` (the router and every pod): `--mtls-ca`, `--mtls-cert` and `--mtls-key`. With them every
  internal plane is mutual TLS: a pod's gRPC server requires a client certificate signed by the cluster CA, the
  router dials pods with its own, and the KV transfer control sockets are wrapped in `ssl.SSLContext`s that
  require the same on both ends (`kv_server_context`, `kv_client_context`).
- Internal peers check each other against the cluster CA and the name `INTERNAL_SERVER_NAME`, which every internal
  certificate carries as a DNS name: pods move between addresses (a Kubernetes pod's IP changes with each start),
  and what makes a peer one of the cluster is the CA's signature, not its address.
Unset fields leave each plane in plain text: the laptop cluster's default.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from common.config import doc
from common.errors import InvalidArgumentError

INTERNAL_SERVER_NAME = "pdserve.internal"
"""The DNS name every internal certificate carries, and the name internal clients verify servers against."""


def _read(field_name: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(field_name, f"cannot read {path}: {exc.strerror}") from None


def _all_or_none(values: dict[str, str | None]) -> None:
    given = [name for name, value in values.items() if value]
    if given and len(given) != len(values):
        missing = sorted(set(values) - set(given))
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InvalidArgumentError(missing[0], f"must be given with {flags}")


@dataclass(frozen=True, slots=True)
class PublicTLSConfig:
    tls_cert: str | None = field(default=None, metadata=doc("PEM certificate (chain) of the public port; TLS on"))
    tls_key: str | None = field(default=None, metadata=doc("PEM private key of --tls-cert"))

    def __post_init__(self) -> None:
        _all_or_none({"tls_cert": self.tls_cert, "tls_key": self.tls_key})

    @property
    def enabled(self) -> bool:
        return bool(self.tls_cert)


@dataclass(frozen=True, slots=True)
class ClusterTLSConfig:
    mtls_ca: str | None = field(
        default=None, metadata=doc("PEM CA of the cluster: with it, router->pod gRPC and KV sockets are mutual TLS")
    )
    mtls_cert: str | None = field(default=None, metadata=doc("PEM certificate of this process, signed by --mtls-ca"))
    mtls_key: str | None = field(default=None, metadata=doc("PEM private key of --mtls-cert"))

    def __post_init__(self) -> None:
        _all_or_none({"mtls_ca": self.mtls_ca, "mtls_cert": self.mtls_cert, "mtls_key": self.mtls_key})

    @property
    def enabled(self) -> bool:
        return bool(self.mtls_ca)


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """How a client dials a gRPC server: plain text (`credentials` None) or TLS, verifying the server's
    certificate against `server_name` when set (else the address's host)."""

    credentials: grpc.ChannelCredentials | None = None
    server_name: str | None = None

    def _options(self, options: Sequence[tuple[str, str | int]]) -> list[tuple[str, str | int]]:
        if self.server_name is None:
            return list(options)
        return [*options, ("grpc.ssl_target_name_override", self.server_name)]

    def aio_channel(
        self,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        options: Sequence[tuple[str, str | int]] = (),
    ) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(address, options=list(options), interceptors=list(interceptors) or None)
        return grpc.aio.secure_channel(
            address, self.credentials, options=self._options(options), interceptors=list(interceptors) or None
        )

    def channel(self, address: str, options: Sequence[tuple[str, str | int]] = ()) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(address, options=list(options))
        return grpc.secure_channel(address, self.credentials, options=self._options(options))


def client_security(
    ca: str | None = None, cert: str | None = None, key: str | None = None, server_name: str | None = None
) -> ChannelSecurity:
    """A client's security from PEM paths: none given -> plain text; `ca` -> TLS verifying the server against it
    (None: the system's roots, if only a client certificate is given); `cert` and `key` -> a client certificate too."""
    if not (ca or cert):
        return ChannelSecurity()
    _all_or_none({"tls_cert": cert, "tls_key": key})
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read("tls_ca", ca) if ca else None,
        private_key=_read("tls_key", key) if key else None,
        certificate_chain=_read("tls_cert", cert) if cert else None,
    )
    return ChannelSecurity(credentials, server_name)


def public_server_credentials(config: PublicTLSConfig) -> grpc.ServerCredentials | None:
    """The public port's credentials: TLS with the router's certificate, no client certificate asked; None: off."""
    if not (config.tls_cert and config.tls_key):
        return None
    pair = (_read("tls_key", config.tls_key), _read("tls_cert", config.tls_cert))
    return grpc.ssl_server_credentials([pair])


def internal_server_credentials(config: ClusterTLSConfig) -> grpc.ServerCredentials | None:
    """A pod server's credentials: mutual TLS requiring a client certificate of the cluster CA; None: off."""
    if not (config.mtls_ca and config.mtls_cert and config.mtls_key):
        return None
    pair = (_read("mtls_key", config.mtls_key), _read("mtls_cert", config.mtls_cert))
    return grpc.ssl_server_credentials(
        [pair], root_certificates=_read("mtls_ca", config.mtls_ca), require_client_auth=True
    )


def internal_channel_security(config: ClusterTLSConfig) -> ChannelSecurity:
    """How the router (and tools) dial pods: with this process's certificate, checking theirs against the CA."""
    if not config.enabled:
        return ChannelSecurity()
    return client_security(config.mtls_ca, config.mtls_cert, config.mtls_key, INTERNAL_SERVER_NAME)


def kv_server_context(config: ClusterTLSConfig) -> ssl.SSLContext | None:
    """The KV receiver's context: its certificate, and a client certificate of the cluster CA required."""
    if not (config.mtls_ca and config.mtls_cert and config.mtls_key):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = ssl.CERT_REQUIRED
    _load(context, config.mtls_ca, config.mtls_cert, config.mtls_key)
    return context


def kv_client_context(config: ClusterTLSConfig) -> ssl.SSLContext | None:
    """The KV sender's context: its certificate; the receiver's checked against the CA and INTERNAL_SERVER_NAME."""
    if not (config.mtls_ca and config.mtls_cert and config.mtls_key):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _load(context, config.mtls_ca, config.mtls_cert, config.mtls_key)
    return context


def _load(context: ssl.SSLContext, ca: str, cert: str, key: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgumentError("mtls_ca", f"cannot load {ca}, {cert}, {key}: {exc}") from None
