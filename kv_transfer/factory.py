"""Pick a KV transfer backend by name (`KVTransferConfig.backend`); the request path does not change with it. A pod
opens its ends with `make_pod_sender` / `make_pod_receiver`: one per rank behind one for a parallel pod."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import InvalidArgumentError
from kv_transfer.base import KVReceiver, KVSender, TransferHook, ignore_hook
from kv_transfer.config import DEVICE_BACKENDS, check_backend
from kv_transfer.control.socket_receiver import SocketReceiver
from kv_transfer.control.socket_sender import SocketSender
from kv_transfer.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from kv_transfer.in_process import InProcessReceiver, InProcessSender
from kv_transfer.nccl import NcclReceiver, NcclSender
from kv_transfer.pool_view import KVPoolView
from kv_transfer.ranked import End, RankedReceiver, RankedSender
from kv_transfer.tcp import TcpReceiver, TcpSender

_SOCKET_SENDERS: dict[str, type[SocketSender[Any]]] = {"tcp": TcpSender, "cuda_ipc": CudaIpcSender, "nccl": NcclSender}
_SOCKET_RECEIVERS: dict[str, type[SocketReceiver]] = {
    "tcp": TcpReceiver,
    "cuda_ipc": CudaIpcReceiver,
    "nccl": NcclReceiver,
}


def _check_pool(backend: str, view: KVPoolView) -> None:
    check_backend(backend)
    if backend in DEVICE_BACKENDS and view.pool.device.type != "cuda":
        raise InvalidArgumentError(
            "kv_transfer_backend",
            f"{backend!r} moves KV between GPU pools, but this pool is on {view.pool.device}; use 'tcp'",
        )


def make_sender(
    backend: str,
    view: KVPoolView,
    *,
    lease_s: float = 30.0,
    connect_timeout_s: float = 5.0,
    on_finished: TransferHook = ignore_hook,
    ssl_context: ssl.SSLContext | None = None,
) -> KVSender:
    """The prefill side's sender over one rank's pool; InvalidArgumentError("kv_transfer_backend") for unknown
    backends and for a device backend (cuda_ipc, nccl) over a pool that is not on a GPU. `ssl_context`: mutual TLS
    on the socket backends' connections (`common.tls.kv_client_context`)."""
    _check_pool(backend, view)
    if backend == "in_process":
        return InProcessSender(view.pool, view.block_size, lease_s=lease_s, on_finished=on_finished, rank=view.rank)
    exported: dict[str, Any] = {"exported_handle": view.ipc_handle} if backend == "cuda_ipc" else {}
    sender = _SOCKET_SENDERS[backend]
    return sender(
        view.pool,
        view.block_size,
        lease_s=lease_s,
        connect_timeout_s=connect_timeout_s,
        on_finished=on_finished,
        ssl_context=ssl_context,
        rank=view.rank,
        **exported,
    )


def make_receiver(
    backend: str,
    view: KVPoolView,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise_host: str | None = None,
    on_released: TransferHook = ignore_hook,
    ssl_context: ssl.SSLContext | None = None,
) -> KVReceiver:
    """The decode side's receiver into one rank's pool (host/port: where it listens for senders); the same errors as
    `make_sender`. `ssl_context`: mutual TLS on the socket backends' connections (`common.tls.kv_server_context`)."""
    _check_pool(backend, view)
    if backend == "in_process":
        return InProcessReceiver(view.pool, view.block_size, on_released=on_released, rank=view.rank)
    receiver = _SOCKET_RECEIVERS[backend]
    return receiver(
        view.pool,
        view.block_size,
        host,
        port,
        advertise_host=advertise_host,
        on_released=on_released,
        ssl_context=ssl_context,
        rank=view.rank,
    )


def make_pod_sender(backend: str, views: Sequence[KVPoolView], **options: Any) -> KVSender:
    """A pod's sender over its ranks' pools (`LLMEngine.kv_pool_views`, in rank order): `make_sender`'s for one rank,
    a RankedSender of one per rank for a parallel pod; `options` are `make_sender`'s."""
    on_finished = options.pop("on_finished", ignore_hook)
    if len(views) == 1:
        return make_sender(backend, views[0], on_finished=on_finished, **options)
    return RankedSender(_open_all(lambda view: make_sender(backend, view, **options), views), on_finished)


def make_pod_receiver(
    backend: str, views: Sequence[KVPoolView], host: str = "127.0.0.1", port: int = 0, **options: Any
) -> KVReceiver:
    """A pod's receiver into its ranks' pools, as `make_pod_sender`; rank r listens on `port + r` (every rank on a
    free port for port 0); `options` are `make_receiver`'s."""
    on_released = options.pop("on_released", ignore_hook)
    if len(views) == 1:
        return make_receiver(backend, views[0], host, port, on_released=on_released, **options)
    return RankedReceiver(
        _open_all(
            lambda view: make_receiver(backend, view, host, port and port + view.rank.world_rank, **options), views
        ),
        on_released,
    )


def _open_all(open_one: Callable[[KVPoolView], End], views: Sequence[KVPoolView]) -> list[End]:
    """One end per view, in rank order; the ones opened are closed again if a later one fails."""
    if [view.rank.world_rank for view in views] != list(range(len(views))):
        ranks = [view.rank.world_rank for view in views]
        raise InvalidArgumentError("views", f"must be the ranks' pools in rank order, got world ranks {ranks}")
    opened: list[End] = []
    try:
        for view in views:
            opened.append(open_one(view))
    except BaseException:
        for end in opened:
            end.close()
        raise
    return opened
