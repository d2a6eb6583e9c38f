"""Choosing a backend by config."""

from __future__ import annotations

import pytest
import torch

from common.errors import InvalidArgumentError
from kv_transfer import KVPoolView, KVTransferConfig, make_receiver, make_sender
from kv_transfer.in_process import InProcessReceiver, InProcessSender
from kv_transfer.tcp import TcpReceiver, TcpSender


def test_backends_by_name() -> None:
    pool = torch.zeros(4, 1, 2, 4, 1, 2)
    with (
        make_sender("tcp", KVPoolView(pool, 4)) as tcp_sender,
        make_receiver("tcp", KVPoolView(pool, 4)) as tcp_receiver,
    ):
        assert isinstance(tcp_sender, TcpSender) and isinstance(tcp_receiver, TcpReceiver)
    with (
        make_sender("in_process", KVPoolView(pool, 4)) as sender,
        make_receiver("in_process", KVPoolView(pool, 4)) as receiver,
    ):
        assert isinstance(sender, InProcessSender) and isinstance(receiver, InProcessReceiver)
        assert receiver.endpoint.startswith("inproc://")


def test_unknown_backend_names_the_flag_and_the_choices() -> None:
    pool = torch.zeros(4, 1, 2, 4, 1, 2)
    for make in (make_sender, make_receiver):
        with pytest.raises(InvalidArgumentError) as raised:
            make("rdma", KVPoolView(pool, 4))
        assert raised.value.field == "kv_transfer_backend"
        assert "'rdma'" in str(raised.value) and "('tcp', 'cuda_ipc', 'nccl', 'in_process')" in str(raised.value)


@pytest.mark.parametrize("backend", ["cuda_ipc", "nccl"])
def test_device_backends_refuse_host_pools_by_the_flag(backend: str) -> None:
    pool = torch.zeros(4, 1, 2, 4, 1, 2)
    for make in (make_sender, make_receiver):
        with pytest.raises(InvalidArgumentError) as raised:
            make(backend, KVPoolView(pool, 4))
        assert raised.value.field == "kv_transfer_backend"
        assert f"{backend!r} moves KV between GPU pools" in str(raised.value) and "'tcp'" in str(raised.value)


def test_config_validates_its_fields() -> None:
    for backend in ("tcp", "cuda_ipc", "nccl", "in_process"):
        assert KVTransferConfig(backend=backend).backend == backend
    assert KVTransferConfig().backend == "tcp"
    with pytest.raises(InvalidArgumentError, match="kv_transfer_backend"):
        KVTransferConfig(backend="rdma")
    with pytest.raises(InvalidArgumentError, match="kv_transfer_port"):
        KVTransferConfig(port=70000)
    with pytest.raises(InvalidArgumentError, match="kv_transfer_lease_s"):
        KVTransferConfig(lease_s=0)
