"""A secure local cluster (`ClusterConfig.credentials`, as `pdserve up --secure` makes it), real processes: 1 prefill
and 1 decode pod, the router, and a redis-server requiring a password over TLS. One cluster serves every test here.

- the public API: no token -> UNAUTHENTICATED, a wrong token -> PERMISSION_DENIED, the right one -> " Paris."
  (greedy), over TLS; plain text is refused; health answers without a token;
- the pods' gRPC servers require a client certificate of the cluster CA (the router has one: it served " Paris.");
- the decode pod's KV socket refuses a sender without the cluster's credentials, and logs it;
- Redis refuses a client without the password, and one without TLS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
import pytest
import torch

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from cli.credentials import ClusterCredentials
from cli.health import check_health
from client.generation_client import GenerationClient
from common.errors import UnavailableError
from common.pod_registry import PodRegistry
from common.tls import ClusterTLSConfig, client_security, internal_channel_security, kv_client_context
from kv_transfer import KVLayout, TransferState
from kv_transfer.tcp import TcpSender
from tests.e2e.support import POD_ARGS, REGISTRY_REFRESH_S, STARTUP_TIMEOUT_S

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def cluster(credentials: ClusterCredentials, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = ClusterConfig(
        num_prefill=1,
        num_decode=1,
        port=0,
        registry_refresh_s=REGISTRY_REFRESH_S,
        pod_args=POD_ARGS,
        log_dir=tmp_path_factory.mktemp("secure-cluster-logs"),
        startup_timeout_s=STARTUP_TIMEOUT_S,
        metrics_port=None,
        credentials=credentials,
    )
    with LocalCluster(config) as running:
        yield running


def _client(cluster: LocalCluster, credentials: ClusterCredentials, token: str | None) -> GenerationClient:
    return GenerationClient(cluster.router_address, token, client_security(str(credentials.ca)))


def _generate(client: GenerationClient) -> tuple[str, int]:
    """The greedy 2-token completion of PROMPT, and how many KV bytes moved prefill -> decode for it."""
    with client:
        responses = list(client.generate(PROMPT, max_tokens=2, temperature=0.0, timeout_s=120.0))
    return "".join(r.text for r in responses), responses[-1].metrics.kv_transfer_bytes


@pytest.mark.parametrize(
    ("token", "code"), [(None, grpc.StatusCode.UNAUTHENTICATED), ("not-the-token", grpc.StatusCode.PERMISSION_DENIED)]
)
def test_a_call_without_the_token_is_refused(
    cluster: LocalCluster, credentials: ClusterCredentials, token: str | None, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _generate(_client(cluster, credentials, token))
    assert info.value.code() is code


def test_the_right_token_over_tls_and_mtls_serves_paris(cluster: LocalCluster, credentials: ClusterCredentials) -> None:
    text, kv_transfer_bytes = _generate(_client(cluster, credentials, credentials.token))
    assert text == " Paris."
    assert kv_transfer_bytes > 0  # NOTE: the prompt's KV crossed the decode pod's mTLS socket


def test_plain_text_to_the_router_is_refused(cluster: LocalCluster, credentials: ClusterCredentials) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _generate(GenerationClient(cluster.router_address, credentials.token))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_health_answers_without_a_token(cluster: LocalCluster, credentials: ClusterCredentials) -> None:
    check = asyncio.run(check_health(cluster.router_address, security=client_security(str(credentials.ca))))
    assert check.status == "SERVING"


def test_pods_require_a_client_certificate_of_the_cluster_ca(
    cluster: LocalCluster, credentials: ClusterCredentials, rogue_tls: ClusterTLSConfig
) -> None:
    [prefill] = [pod for pod in cluster.pod_infos() if pod.role == "prefill"]
    securities = {
        "cluster": internal_channel_security(credentials.cluster_tls()),
        "rogue": internal_channel_security(rogue_tls),
        "no certificate": client_security(str(credentials.ca), server_name="pdserve.internal"),
    }
    checks = {name: asyncio.run(check_health(prefill.address, security=s)).status for name, s in securities.items()}
    assert checks == {"cluster": "SERVING", "rogue": "UNREACHABLE", "no certificate": "UNREACHABLE"}


def test_the_kv_socket_refuses_a_sender_without_the_cluster_credentials(
    cluster: LocalCluster, rogue_tls: ClusterTLSConfig
) -> None:
    [decode] = [pod for pod in cluster.pod_infos() if pod.role == "decode"]
    log = Path(cluster.pods[decode.pod_id].log_path)
    pool = torch.zeros((4, 2, 2, 16, 2, 8))
    # NOTE: the handshake fails before any layout is compared, so the sender's own layout serves as the receiver's.
    with TcpSender(pool, 16, connect_timeout_s=5.0, ssl_context=kv_client_context(rogue_tls)) as sender:
        sender.send("rogue-1", decode.kv_endpoint, KVLayout.from_pool(pool, 16), [0], [0], last=True)
        assert sender.wait("rogue-1", 10.0) is TransferState.FAILED
    deadline = time.monotonic() + 10.0
    while "refused a peer" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "without the cluster's credentials" in log.read_text()


def test_redis_requires_its_password_and_tls(cluster: LocalCluster) -> None:
    url = urlsplit(cluster.redis_url)
    without_password = urlunsplit(url._replace(netloc=f"{url.hostname}:{url.port}"))
    without_tls = urlunsplit(url._replace(scheme="redis", query=""))

    async def list_pods(redis_url: str) -> list[str]:
        registry = PodRegistry(redis_url, timeout_s=2.0)
        try:
            return sorted(pod.pod_id for pod in await registry.list_pods())
        finally:
            await registry.aclose()

    assert asyncio.run(list_pods(cluster.redis_url)) == ["decode-0", "prefill-0"]
    for refused in (without_password, without_tls):
        with pytest.raises(UnavailableError):
            asyncio.run(list_pods(refused))
    credentials = cluster.config.credentials
    assert credentials is not None
    processes = [*cluster.pods.values(), cluster.router]
    command_lines = "\n".join(Path(f"/proc/{p.pid}/cmdline").read_text() for p in processes if p is not None)
    logs = "\n".join(p.log_tail(10_000) for p in processes if p is not None)
    assert credentials.redis_password in cluster.redis_url
    assert credentials.redis_password not in command_lines + logs
