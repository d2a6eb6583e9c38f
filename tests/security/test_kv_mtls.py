"""The KV transfer control sockets under mutual TLS (tcp backend, real loopback sockets): a transfer between two
holders of the cluster's credentials lands byte for byte; a peer without them is refused at the handshake, logged,
and nothing it sent reaches the pool."""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from common.tls import ClusterTLSConfig, kv_client_context, kv_server_context
from kv_transfer import TransferState
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.frames import Hello
from kv_transfer.tcp import TcpReceiver, TcpSender
from tests.kv_transfer.pools import BLOCK_SIZE, random_pool


@pytest.fixture
def pool() -> torch.Tensor:
    return random_pool(8, seed=2)


@pytest.fixture
def receiver(pool: torch.Tensor, cluster_tls: ClusterTLSConfig) -> Iterator[TcpReceiver]:
    with TcpReceiver(pool, BLOCK_SIZE, ssl_context=kv_server_context(cluster_tls)) as built:
        yield built


def _eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether `condition` holds within `timeout_s` (the receiver logs and counts a refusal after closing)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _send(receiver: TcpReceiver, source: torch.Tensor, context: ssl.SSLContext | None) -> TransferState:
    """One transfer of source blocks [1, 2] into destination blocks [3, 4]; its final state."""
    receiver.expect("t1", [3, 4], lease_s=5.0)
    with TcpSender(source, BLOCK_SIZE, connect_timeout_s=2.0, ssl_context=context) as sender:
        sender.send("t1", receiver.endpoint, receiver.layout, [1, 2], [3, 4], last=True)
        return sender.wait("t1", 5.0)


def test_a_cluster_peer_transfers_over_mtls(
    receiver: TcpReceiver, pool: torch.Tensor, cluster_tls: ClusterTLSConfig
) -> None:
    source = random_pool(8, seed=1)
    assert _send(receiver, source, kv_client_context(cluster_tls)) is TransferState.DONE
    assert torch.equal(pool[3:5], source[1:3])
    assert receiver.num_peers_refused == 0


@pytest.mark.parametrize("peer", ["plain_tcp", "rogue_ca"])
def test_a_peer_without_the_cluster_credentials_is_refused(
    peer: str,
    receiver: TcpReceiver,
    pool: torch.Tensor,
    rogue_tls: ClusterTLSConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = pool.clone()
    context = kv_client_context(rogue_tls) if peer == "rogue_ca" else None
    with caplog.at_level(logging.WARNING, logger="kv_transfer.control.socket_receiver"):
        state = _send(receiver, random_pool(8, seed=1), context)
        assert _eventually(lambda: receiver.num_peers_refused == 1)
    assert state is TransferState.FAILED
    assert torch.equal(pool, before)
    assert receiver.num_connections_accepted == 1
    assert "without the cluster's credentials" in caplog.text
    assert receiver.state("t1") is TransferState.RESERVED


def test_raw_frames_before_a_handshake_are_never_read(receiver: TcpReceiver, pool: torch.Tensor) -> None:
    """A HELLO in plain text is not a TLS ClientHello: the receiver drops the connection without a HELLO back."""
    before = pool.clone()
    with socket.create_connection(parse_endpoint(receiver.endpoint), timeout=5.0) as sock:
        sock.sendall(Hello("tcp", receiver.layout, {}).encode())
        try:
            answer = sock.recv(64)
        except ConnectionResetError:
            answer = b""
    assert b"PDKV" not in answer
    assert torch.equal(pool, before)
    assert _eventually(lambda: receiver.num_peers_refused == 1)


def test_many_chunks_in_flight_while_acks_come_back(cluster_tls: ClusterTLSConfig) -> None:
    """The sender's writer thread sends while its reader thread takes ACKs on the same TLS connection (an
    ssl.SSLSocket used so stalled: a write timed out under load), 64 chunks of 4 blocks of 64 KiB, all in flight."""
    source = random_pool(256, seed=3, head_dim=1024)
    destination = torch.zeros_like(source)
    with (
        TcpReceiver(destination, BLOCK_SIZE, ssl_context=kv_server_context(cluster_tls)) as receiver,
        TcpSender(source, BLOCK_SIZE, ssl_context=kv_client_context(cluster_tls)) as sender,
    ):
        for i in range(64):
            blocks = list(range(4 * i, 4 * i + 4))
            receiver.expect(f"t{i}", blocks, lease_s=30.0)
            sender.send(f"t{i}", receiver.endpoint, receiver.layout, blocks, blocks, last=True)
        states = {sender.wait(f"t{i}", 60.0) for i in range(64)}
    assert states == {TransferState.DONE}
    assert torch.equal(destination, source)
    assert sender.num_connections == 1
