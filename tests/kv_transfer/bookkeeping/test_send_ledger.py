"""SendLedger: the sender-side rules, without any transport."""

from __future__ import annotations

import time

import pytest

from common.errors import InvalidArgumentError
from kv_transfer import LayoutMismatchError, TransferState, TransferStateError, UnknownTransferError
from kv_transfer.bookkeeping.send_ledger import SendLedger

S = TransferState


@pytest.fixture
def notified() -> list[tuple[str, TransferState]]:
    return []


def _ledger(notified: list[tuple[str, TransferState]], lease_s: float = 5.0) -> SendLedger:
    return SendLedger(lease_s, lambda tid, state: notified.append((tid, state)))


def test_acks_count_bytes_and_the_last_one_ends_done(notified: list[tuple[str, TransferState]]) -> None:
    ledger = _ledger(notified)
    assert ledger.open_chunk("t", "ep", last=False)
    assert ledger.open_chunk("t", "ep", last=True)
    ledger.ack("t", 100, 2, last=False)
    assert ledger.state("t") is S.TRANSFERRING
    ledger.ack("t", 50, 1, last=True)
    stats = ledger.stats("t")
    assert (stats.state, stats.num_bytes, stats.num_blocks, stats.num_chunks) == (S.DONE, 150, 3, 2)
    assert notified == [("t", S.DONE)]
    assert not ledger.open_chunk("t", "ep", last=True)  # ended: the chunk is dropped


def test_misuse_raises(notified: list[tuple[str, TransferState]]) -> None:
    ledger = _ledger(notified)
    ledger.open_chunk("t", "ep", last=True)
    with pytest.raises(TransferStateError):
        ledger.open_chunk("t", "ep", last=True)
    ledger.open_chunk("u", "ep", last=False)
    with pytest.raises(InvalidArgumentError, match="endpoint"):
        ledger.open_chunk("u", "other", last=True)
    with pytest.raises(UnknownTransferError):
        ledger.stats("never")


def test_acks_renew_the_lease(notified: list[tuple[str, TransferState]]) -> None:
    ledger = _ledger(notified, lease_s=0.05)
    ledger.open_chunk("t", "ep", last=False)
    for _ in range(3):
        time.sleep(0.03)
        ledger.ack("t", 1, 1, last=False)
        assert ledger.reap() == []
    time.sleep(0.06)
    assert ledger.reap() == [("t", "ep")]
    assert ledger.state("t") is S.EXPIRED and notified == [("t", S.EXPIRED)]
    ledger.ack("t", 1, 1, last=True)  # a late ack changes nothing
    assert ledger.state("t") is S.EXPIRED and ledger.stats("t").num_bytes == 3


def test_abort_and_fail_new_end_once(notified: list[tuple[str, TransferState]]) -> None:
    ledger = _ledger(notified)
    ledger.open_chunk("t", "ep", last=False)
    assert ledger.abort("t") == "ep"
    assert ledger.abort("t") is None
    ledger.fail_new("u", "ep", LayoutMismatchError("differ", ["dtype"]))
    assert ledger.state("u") is S.FAILED
    assert notified == [("t", S.ABORTED), ("u", S.FAILED)]


def test_abort_before_the_first_chunk_needs_the_endpoint(notified: list[tuple[str, TransferState]]) -> None:
    ledger = _ledger(notified)
    assert ledger.abort("t") is None  # no chunk, no endpoint: nothing to tell anyone
    with pytest.raises(UnknownTransferError):
        ledger.state("t")
    assert ledger.abort("t", "ep") == "ep"
    assert ledger.state("t") is S.ABORTED and ledger.stats("t").num_chunks == 0
    assert not ledger.open_chunk("t", "ep", last=True)  # ended: the late chunk is dropped
    assert ledger.abort("t", "ep") is None
    ledger.open_chunk("u", "ep", last=False)
    assert ledger.abort("u", "other") == "ep"  # a live transfer's own endpoint is the one told
    assert notified == [("t", S.ABORTED), ("u", S.ABORTED)]
