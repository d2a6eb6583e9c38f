"""What only cuda_ipc has: its pool handle, the receiver's checks of a sender, and its chunks' source ids."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from kv_transfer import TransferState, TransportError
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.frames import FrameHead, FrameType, Hello, read_error, read_head, read_hello
from kv_transfer.copy_stream import Fence
from kv_transfer.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from kv_transfer.cuda_ipc import receiver as receiver_module
from kv_transfer.cuda_ipc.pool_handle import PoolHandle
from kv_transfer.cuda_ipc.sender import CudaIpcSenderPlane
from kv_transfer.state import ProtocolError
from tests.kv_transfer.pools import BLOCK_SIZE

PoolMaker = Callable[..., torch.Tensor]
S = TransferState
HANDLE = PoolHandle(b"\x00ipc\xff", 1 << 20, 4096, 512, 8, 1024, b"/torch_1_2", 3, b"event", True)


@pytest.fixture
def receiver(make_pool: PoolMaker) -> Iterator[CudaIpcReceiver]:
    with CudaIpcReceiver(make_pool(8, seed=2), BLOCK_SIZE) as built:
        yield built


def _hello(receiver: CudaIpcReceiver, plane: dict[str, Any]) -> tuple[socket.socket, FrameHead]:
    sock = socket.create_connection(parse_endpoint(receiver.endpoint), timeout=2.0)
    sock.sendall(Hello("cuda_ipc", receiver.layout, plane).encode())
    return sock, read_head(sock, lambda: False)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_pool_handle_round_trips_through_json() -> None:
    assert PoolHandle.from_dict(json.loads(json.dumps(HANDLE.to_dict()))) == HANDLE


@pytest.mark.parametrize(
    "change",
    [
        {"ipc_handle": "not base64!"},
        {"num_blocks": -1},
        {"num_blocks": 2000},  # rows past the storage
        {"extra": 1},
    ],
)
def test_pool_handle_rejects_what_it_cannot_map(change: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        PoolHandle.from_dict(HANDLE.to_dict() | change)


def test_a_sender_elsewhere_with_a_host_pool_is_refused(receiver: CudaIpcReceiver) -> None:
    sock, head = _hello(receiver, {"process": "another-process", "pool": "p", "handle": None})
    with sock:
        assert head.kind is FrameType.ERROR
        error = read_error(sock, head, lambda: False)
        assert isinstance(error, TransportError) and "not on a GPU" in str(error)


def test_a_sender_of_this_process_that_closed_is_refused(receiver: CudaIpcReceiver, make_pool: PoolMaker) -> None:
    plane = CudaIpcSenderPlane(make_pool(8, seed=1))
    hello = plane.hello()
    plane.close()
    sock, head = _hello(receiver, hello)
    with sock:
        assert head.kind is FrameType.ERROR
        assert "its sender closed" in str(read_error(sock, head, lambda: False))


@pytest.mark.parametrize(
    "chunk",
    [
        FrameHead(FrameType.CHUNK, 0, "t1", (1,), True, 0, (8,)),  # outside the sender's pool of 8
        FrameHead(FrameType.CHUNK, 0, "t1", (1,), True, 0, ()),  # no source
        FrameHead(FrameType.CHUNK, 0, "t1", (1,), True, 16, (0,)),  # a payload
    ],
)
def test_a_chunk_that_does_not_fit_closes_the_connection_unwritten(
    receiver: CudaIpcReceiver, make_pool: PoolMaker, chunk: FrameHead
) -> None:
    plane = CudaIpcSenderPlane(make_pool(8, seed=1))
    receiver.expect("t1", [1], lease_s=5.0)
    sock, head = _hello(receiver, plane.hello())
    with sock:
        assert head.kind is FrameType.HELLO
        read_hello(sock, head, lambda: False)
        sock.sendall(chunk.encode())
        assert _closed_by_peer(sock)
    assert receiver.state("t1") is S.RESERVED
    plane.close()


def test_the_next_chunk_is_started_before_the_last_one_is_waited_for(
    make_pool: PoolMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two chunks sent back to back: the receiver queues the second's copy before it waits for the first's, then
    answers both in order; every block lands."""
    events: list[tuple[str, int]] = []
    start = receiver_module._CopyLink.start

    class Recorded:
        def __init__(self, fence: Fence, seq: int) -> None:
            self._fence, self._seq = fence, seq

        def synchronize(self) -> None:
            events.append(("wait", self._seq))
            self._fence.synchronize()

    def recording_start(link: Any, sock: socket.socket, head: FrameHead, keep: Any, fence: Fence) -> Fence:
        events.append(("start", head.seq))
        return Recorded(start(link, sock, head, keep, fence), head.seq)

    monkeypatch.setattr(receiver_module._CopyLink, "start", recording_start)
    src, dst = make_pool(8, seed=1), make_pool(8, seed=2)
    plane = CudaIpcSenderPlane(src)
    with CudaIpcReceiver(dst, BLOCK_SIZE) as receiver:
        receiver.expect("t", [1, 2], lease_s=5.0)
        sock, head = _hello(receiver, plane.hello())
        with sock:
            read_hello(sock, head, lambda: False)
            first = FrameHead(FrameType.CHUNK, 0, "t", (1,), False, 0, (3,))
            sock.sendall(first.encode() + FrameHead(FrameType.CHUNK, 1, "t", (2,), True, 0, (4,)).encode())
            acks = [read_head(sock, lambda: False) for _ in range(2)]
        assert receiver.state("t") is S.DONE
    assert [(ack.kind, ack.seq) for ack in acks] == [(FrameType.ACK, 0), (FrameType.ACK, 1)]
    assert events == [("start", 0), ("start", 1), ("wait", 0), ("wait", 1)]
    assert torch.equal(dst[1], src[3]) and torch.equal(dst[2], src[4])
    plane.close()


@pytest.mark.gpu
def test_a_chunk_waits_for_the_engine_work_before_its_reservation_and_for_none_after(make_pool: PoolMaker) -> None:
    src, dst = make_pool(4, seed=1).cuda(), make_pool(4, seed=2).cuda()
    engine, prefill = torch.cuda.Stream(), torch.cuda.Stream()
    with CudaIpcSender(src, BLOCK_SIZE) as sender, CudaIpcReceiver(dst, BLOCK_SIZE) as receiver:
        # NOTE: a first transfer maps the pool and allocates the receiver's buffers (a pinned allocation may wait for
        # the whole device); the prefill pod's sends run on a stream of their own.
        with torch.cuda.stream(prefill):
            receiver.expect("warm", [0], lease_s=5.0)
            sender.send("warm", receiver.endpoint, receiver.layout, [0], [0], last=True)
            assert receiver.wait("warm", 5.0) is S.DONE
        with torch.cuda.stream(engine):
            torch.cuda._sleep(50_000_000)
            dst[1].fill_(0.0)  # the engine's last write into a block it freed, still queued when it is reserved
            receiver.expect("t", [1], lease_s=5.0)
            torch.cuda._sleep(2_000_000_000)  # about a second of later engine work
        with torch.cuda.stream(prefill):
            sender.send("t", receiver.endpoint, receiver.layout, [2], [1], last=True)
            assert receiver.wait("t", 5.0) is S.DONE
        assert not engine.query(), "the chunk waited for engine work queued after its reservation"
        torch.cuda.synchronize()
        assert torch.equal(dst[1], src[2])
