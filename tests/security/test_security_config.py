"""The security switches as flags and PDSERVE_* variables: the router's and the pods' parsers read them, and a
half-given pair (a certificate without its key) exits with a usage error naming the missing flag."""

from __future__ import annotations

import pytest

from common.auth import AuthConfig
from common.tls import ClusterTLSConfig, PublicTLSConfig
from pod.config import parse_pod_config
from router.__main__ import parse_args
from router.security import RouterSecurity

MTLS_ENV = {"PDSERVE_MTLS_CA": "/tls/ca.pem", "PDSERVE_MTLS_CERT": "/tls/i.pem", "PDSERVE_MTLS_KEY": "/tls/i.key"}
CLUSTER_TLS = ClusterTLSConfig("/tls/ca.pem", "/tls/i.pem", "/tls/i.key")


def test_the_router_reads_every_switch_from_the_environment() -> None:
    environ = {
        **MTLS_ENV,
        "PDSERVE_TLS_CERT": "/tls/p.pem",
        "PDSERVE_TLS_KEY": "/tls/p.key",
        "PDSERVE_AUTH_TOKENS": "a,b",
        "PDSERVE_AUTH_EXEMPT_HEALTH": "0",
    }
    *_, security = parse_args([], environ)
    assert security == RouterSecurity(
        PublicTLSConfig("/tls/p.pem", "/tls/p.key"), CLUSTER_TLS, AuthConfig(None, "a,b", auth_exempt_health=False)
    )
    *_, flags = parse_args(["--auth-tokens-file", "/tls/tokens", "--no-auth-exempt-health"], {})
    assert flags.auth == AuthConfig("/tls/tokens", None, auth_exempt_health=False)
    assert parse_args([], {})[3] == RouterSecurity()


def test_pods_read_the_mtls_switch() -> None:
    assert parse_pod_config("decode", [], with_receiver=True, environ=MTLS_ENV).tls == CLUSTER_TLS
    assert parse_pod_config("prefill", [], with_receiver=False, environ={}).tls == ClusterTLSConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert", "/tls/p.pem"], "--tls-key: must be given with --tls-cert"),
        (["--mtls-ca", "/tls/ca.pem"], "--mtls-cert: must be given with --mtls-ca"),
    ],
)
def test_a_half_given_pair_is_a_usage_error(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv, {})
    assert info.value.code == 2
    assert message in capsys.readouterr().err
