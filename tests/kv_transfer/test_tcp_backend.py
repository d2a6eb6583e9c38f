"""What only the tcp backend has: real ports, one reused connection, and the wire protocol under misuse."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import torch

from kv_transfer import KVLayout, TransferState
from kv_transfer.control.address import format_endpoint, parse_endpoint
from kv_transfer.control.frames import FrameHead, FrameType, Hello, read_head, read_json
from kv_transfer.tcp import TcpReceiver, TcpSender

if TYPE_CHECKING:
    from conftest import HookRecorder

PoolMaker = Callable[..., torch.Tensor]
BLOCK_SIZE = 4
S = TransferState


@pytest.fixture
def receiver(make_pool: PoolMaker, released: HookRecorder) -> Iterator[TcpReceiver]:
    with TcpReceiver(make_pool(8, seed=2), BLOCK_SIZE, on_released=released) as built:
        yield built


def _connect(endpoint: str, layout: KVLayout) -> socket.socket:
    """A raw client that has done the handshake."""
    sock = socket.create_connection(parse_endpoint(endpoint), timeout=2.0)
    sock.sendall(Hello("tcp", layout, {}).encode())
    head = read_head(sock, lambda: False)
    assert head.kind is FrameType.HELLO
    read_json(sock, head, lambda: False)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_endpoint_is_a_real_loopback_port(receiver: TcpReceiver) -> None:
    host, port = parse_endpoint(receiver.endpoint)
    assert host == "127.0.0.1" and port > 0
    with socket.create_connection((host, port), timeout=2.0):
        pass


def test_one_connection_is_reused_across_transfers(receiver: TcpReceiver, make_pool: PoolMaker) -> None:
    with TcpSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        for i in range(3):
            receiver.expect(f"t{i}", [i], lease_s=5.0)
            sender.send(f"t{i}", receiver.endpoint, receiver.layout, [i], [i], last=True)
            assert sender.wait(f"t{i}", 2.0) is S.DONE
        assert sender.num_connections == 1
        assert receiver.num_connections_accepted == 1


def test_sender_reconnects_after_the_receiver_restarts(make_pool: PoolMaker) -> None:
    dst = make_pool(8, seed=2)
    with TcpSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        first = TcpReceiver(dst, BLOCK_SIZE)
        first.expect("t1", [1], lease_s=5.0)
        sender.send("t1", first.endpoint, first.layout, [0], [1], last=True)
        assert sender.wait("t1", 2.0) is S.DONE
        port = parse_endpoint(first.endpoint)[1]
        first.close()
        time.sleep(0.2)  # the sender's reader sees the connection close
        with TcpReceiver(dst, BLOCK_SIZE, port=port) as second:
            second.expect("t2", [2], lease_s=5.0)
            sender.send("t2", second.endpoint, second.layout, [5], [2], last=True)
            assert sender.wait("t2", 2.0) is S.DONE
            assert torch.equal(dst[2], make_pool(8, seed=1)[5])
            assert sender.num_connections == 2


def test_stalled_chunk_does_not_hold_an_expired_reservation(
    receiver: TcpReceiver, make_pool: PoolMaker, released: HookRecorder
) -> None:
    lease_s = 0.3
    receiver.expect("t1", [1, 2], lease_s=lease_s)
    block_nbytes = receiver.layout.block_nbytes
    with _connect(receiver.endpoint, receiver.layout) as sock:
        sock.sendall(FrameHead(FrameType.CHUNK, 0, "t1", (1, 2), True, 2 * block_nbytes).encode())
        sock.sendall(bytes(block_nbytes // 2))  # then the sender stalls mid-chunk
        start = time.monotonic()

        assert released.wait_for(1, lease_s + 0.5) == [("t1", S.EXPIRED)]
        assert time.monotonic() - start <= lease_s + 0.5
        assert _closed_by_peer(sock)


def test_receiver_refuses_a_mismatched_sender_that_ignores_the_handshake(
    make_pool: PoolMaker,
) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    with TcpReceiver(dst, BLOCK_SIZE) as receiver:
        receiver.expect("t1", [1], lease_s=5.0)
        wrong = KVLayout("float32", BLOCK_SIZE, 2, 2, 16)
        with _connect(receiver.endpoint, wrong) as sock:
            payload = bytes(range(256)) * (wrong.block_nbytes // 256)
            with pytest.raises(OSError):  # the receiver closed the connection after its HELLO
                for _ in range(64):
                    sock.sendall(FrameHead(FrameType.CHUNK, 0, "t1", (1,), True, len(payload)).encode() + payload)
                    time.sleep(0.01)
        assert receiver.state("t1") is S.RESERVED
        assert torch.equal(dst, before)


def test_garbage_closes_only_that_connection(receiver: TcpReceiver, make_pool: PoolMaker) -> None:
    with socket.create_connection(parse_endpoint(receiver.endpoint), timeout=2.0) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _closed_by_peer(sock)
    receiver.expect("t1", [1], lease_s=5.0)
    with TcpSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=True)
        assert sender.wait("t1", 2.0) is S.DONE


def test_frame_head_round_trips() -> None:
    head = FrameHead(FrameType.CHUNK, 7, "req-é", (5, 0, 4_000_000_000), True, 3 * 256)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(head.encode())
        assert read_head(right, lambda: False) == head


def test_endpoints_format_and_parse() -> None:
    assert format_endpoint("10.0.0.2", 7000) == "10.0.0.2:7000"
    assert format_endpoint("::1", 7000) == "[::1]:7000"
    assert parse_endpoint("[::1]:7000") == ("::1", 7000)
    assert parse_endpoint("decode-0.pods:7000") == ("decode-0.pods", 7000)
    with pytest.raises(ValueError, match="endpoint"):
        parse_endpoint("decode-0")


@pytest.mark.gpu
def test_device_pools_go_through_host_staging(make_pool: PoolMaker) -> None:
    src = make_pool(8, torch.bfloat16, seed=1).cuda()
    dst = make_pool(8, torch.bfloat16, seed=2).cuda()
    with TcpReceiver(dst, BLOCK_SIZE) as receiver, TcpSender(src, BLOCK_SIZE) as sender:
        receiver.expect("t1", [6, 1], lease_s=5.0)
        sender.send("t1", receiver.endpoint, receiver.layout, [2, 3], [6, 1], last=True)
        assert sender.wait("t1", 2.0) is S.DONE
        assert torch.equal(dst[[6, 1]], src[[2, 3]])
