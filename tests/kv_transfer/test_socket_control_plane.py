"""The control plane every socket backend shares (frames, handshake), apart from any one data plane."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kv_transfer import KVLayout, TransferState
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.frames import FrameHead, FrameType, Hello, encode_json_frame, read_error, read_head, read_hello
from kv_transfer.cuda_ipc import CudaIpcReceiver
from kv_transfer.state import ProtocolError
from kv_transfer.tcp import TcpReceiver, TcpSender
from tests.kv_transfer.pools import BLOCK_SIZE

PoolMaker = Callable[..., torch.Tensor]
S = TransferState


def _raw_hello(endpoint: str, body: dict[str, Any]) -> tuple[socket.socket, FrameHead]:
    """A raw client that sent HELLO `body`, and the head of the answer."""
    sock = socket.create_connection(parse_endpoint(endpoint), timeout=2.0)
    sock.sendall(encode_json_frame(FrameType.HELLO, body))
    return sock, read_head(sock, lambda: False)


def test_frame_head_with_source_ids_round_trips() -> None:
    head = FrameHead(FrameType.CHUNK, 9, "t", (7, 1), True, 0, (3, 4_000_000_000))
    left, right = socket.socketpair()
    with left, right:
        left.sendall(head.encode())
        assert read_head(right, lambda: False) == head


def test_hello_round_trips() -> None:
    hello = Hello("nccl", KVLayout("bfloat16", 16, 36, 8, 128), {"device": "GPU-1"})
    left, right = socket.socketpair()
    with left, right:
        left.sendall(hello.encode())
        assert read_hello(right, read_head(right, lambda: False), lambda: False) == hello


def test_a_sender_of_another_backend_is_refused_by_name(make_pool: PoolMaker) -> None:
    with CudaIpcReceiver(make_pool(8), BLOCK_SIZE) as receiver, TcpSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        receiver.expect("t1", [1], lease_s=5.0)
        sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=True)

        assert sender.wait("t1", 2.0) is S.FAILED
        error = sender.stats("t1").error
        assert isinstance(error, ProtocolError)
        assert "'cuda_ipc' backend, the sender 'tcp'" in str(error)
        assert receiver.state("t1") is S.RESERVED


def test_a_hello_without_backend_or_plane_closes_the_connection(make_pool: PoolMaker) -> None:
    with TcpReceiver(make_pool(8), BLOCK_SIZE) as receiver:
        sock = socket.create_connection(parse_endpoint(receiver.endpoint), timeout=2.0)
        with sock:
            sock.sendall(encode_json_frame(FrameType.HELLO, {"layout": receiver.layout.to_dict()}))
            assert sock.recv(1) == b""


def test_a_refused_plane_answers_with_the_error(make_pool: PoolMaker) -> None:
    with CudaIpcReceiver(make_pool(8), BLOCK_SIZE) as receiver:
        body = {"backend": "cuda_ipc", "layout": receiver.layout.to_dict(), "plane": {"process": 1}}
        sock, head = _raw_hello(receiver.endpoint, body)
        with sock:
            assert head.kind is FrameType.ERROR
            error = read_error(sock, head, lambda: False)
            assert isinstance(error, ProtocolError) and "names the sender's process and pool" in str(error)


def test_json_that_is_not_json_is_a_protocol_error() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(FrameHead(FrameType.HELLO, payload_nbytes=3).encode() + b"{x:")
        with pytest.raises(ProtocolError, match="not JSON"):
            read_hello(right, read_head(right, lambda: False), lambda: False)
