"""The router's security settings, one switch each (all off by default): TLS on the public port
(`common.tls.PublicTLSConfig`), mutual TLS to the pods (`common.tls.ClusterTLSConfig`) and bearer tokens on the
public API (`common.auth.AuthConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
import grpc.aio

from common.auth import AuthConfig, AuthInterceptor, authenticator_for
from common.tls import (
    ChannelSecurity,
    ClusterTLSConfig,
    PublicTLSConfig,
    internal_channel_security,
    public_server_credentials,
)


@dataclass(frozen=True, slots=True)
class RouterSecurity:
    public_tls: PublicTLSConfig = field(default_factory=PublicTLSConfig)
    cluster_tls: ClusterTLSConfig = field(default_factory=ClusterTLSConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The auth interceptor when tokens are configured (it goes before the ErrorInterceptor); else none."""
        authenticator = authenticator_for(self.auth)
        return [] if authenticator is None else [AuthInterceptor(authenticator)]

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """The public port's TLS credentials; None: plain text."""
        return public_server_credentials(self.public_tls)

    def pod_channels(self) -> ChannelSecurity:
        """How the router dials pods: mutual TLS with the cluster CA, or plain text."""
        return internal_channel_security(self.cluster_tls)
