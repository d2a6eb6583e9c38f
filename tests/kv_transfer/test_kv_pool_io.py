"""pool_io: blocks as byte rows, gathered out and landed in place."""

from __future__ import annotations

import pytest
import torch

from kv_transfer.pool_io import (
    HostBlockSink,
    IndexUploader,
    StagedBlockSink,
    gather_blocks,
    pool_bytes,
    start_gather_to_host,
)


def _pool() -> torch.Tensor:
    return torch.arange(4 * 2 * 2 * 2 * 1 * 2, dtype=torch.float32).reshape(4, 2, 2, 2, 1, 2)


def test_pool_bytes_rows_share_the_pool_memory() -> None:
    pool = _pool()
    rows = pool_bytes(pool)
    assert rows.shape == (4, 64) and rows.dtype == torch.uint8
    rows[2].fill_(0)
    assert torch.equal(pool[2], torch.zeros(2, 2, 2, 1, 2))
    assert pool[3].flatten().tolist() == list(range(48, 64))


def test_gather_copies_the_rows_in_order() -> None:
    pool = _pool()
    gathered = gather_blocks(pool_bytes(pool), [3, 0])
    pool.zero_()
    assert gathered.view("float32")[:, 0].tolist() == [48.0, 0.0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gather_to_host_captures_the_blocks_when_started(device: str) -> None:
    pool = _pool().to(device)
    started = start_gather_to_host(pool_bytes(pool), [3, 0])
    pool.zero_()  # queued after the copy: the blocks as they were when the gather started come back
    assert started.wait().view("float32")[:, 0].tolist() == [48.0, 0.0]


def test_host_sink_buffers_are_the_blocks() -> None:
    pool = _pool()
    write = HostBlockSink(pool_bytes(pool)).open([1])
    write.buffers[0][:] = bytes(64)
    assert torch.equal(pool[1], torch.zeros(2, 2, 2, 1, 2))


def test_staged_sink_writes_on_commit_only() -> None:
    pool = _pool()
    before = pool.clone()
    write = StagedBlockSink(pool_bytes(pool)).open([2, 0])
    for buffer in write.buffers:
        buffer[:] = bytes(64)
    assert torch.equal(pool, before)
    write.commit()
    assert torch.equal(pool[[0, 2]], torch.zeros(2, 2, 2, 2, 1, 2))
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_index_uploader_returns_each_list_and_reuses_its_buffer(device: str) -> None:
    uploader = IndexUploader(torch.device(device))
    src, dst = uploader.upload([7, 3, 5], [0, 1])
    assert src.tolist() == [7, 3, 5] and dst.tolist() == [0, 1]
    assert src.dtype == torch.long and src.device.type == device
    assert dst.data_ptr() - src.data_ptr() == 4 * 8  # the second list starts 16-byte aligned after 3 ids
    (again,) = uploader.upload(list(range(20)))
    assert again.tolist() == list(range(20))
    (shorter,) = uploader.upload([])
    assert shorter.tolist() == []
