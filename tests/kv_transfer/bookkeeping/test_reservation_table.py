"""ReservationTable: the receiver-side rules, without any transport."""

from __future__ import annotations

import time

import pytest

from common.errors import InvalidArgumentError
from kv_transfer import (
    InvalidChunkError,
    TransferAbortedError,
    TransferExpiredError,
    TransferState,
    TransferStateError,
    TransportError,
    UnknownTransferError,
)
from kv_transfer.bookkeeping.reservation_table import ReservationTable
from kv_transfer.copy_stream import PASSED

S = TransferState


@pytest.fixture
def notified() -> list[tuple[str, TransferState]]:
    return []


@pytest.fixture
def table(notified: list[tuple[str, TransferState]]) -> ReservationTable:
    return ReservationTable(num_blocks=8, notify=lambda tid, state: notified.append((tid, state)))


def test_expect_validates_its_arguments(table: ReservationTable) -> None:
    with pytest.raises(InvalidArgumentError, match="dst_block_ids"):
        table.expect("t", [1, 1], 1.0)
    with pytest.raises(InvalidArgumentError, match="dst_block_ids"):
        table.expect("t", [8], 1.0)
    with pytest.raises(InvalidArgumentError, match="lease_s"):
        table.expect("t", [1], 0.0)
    table.expect("t", [1], 1.0)
    with pytest.raises(TransferStateError):
        table.expect("t", [2], 1.0)


def test_chunks_move_the_state_to_done(table: ReservationTable, notified: list[tuple[str, TransferState]]) -> None:
    table.expect("t", [1, 2], 5.0)
    table.begin_chunk("t", [2])
    assert table.state("t") is S.TRANSFERRING
    assert table.end_chunk("t", [2], last=False, complete=True) is None
    table.begin_chunk("t", [1])
    assert table.end_chunk("t", [1], last=True, complete=True) is None
    assert table.wait("t", 0.0) is S.DONE
    with pytest.raises(TransferStateError):
        table.begin_chunk("t", [1])
    table.claim("t")
    with pytest.raises(UnknownTransferError):
        table.state("t")
    assert notified == []


def test_expiry_during_a_write_defers_the_release(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("t", [1], 0.01)
    table.begin_chunk("t", [1])
    time.sleep(0.02)
    table.reap()
    assert table.state("t") is S.EXPIRED
    assert not table.is_writable("t")
    assert notified == []  # the write is still going on: the engine must not free the block yet

    error = table.end_chunk("t", [1], last=True, complete=False)

    assert isinstance(error, TransferExpiredError)
    assert notified == [("t", S.EXPIRED)]
    table.reap()
    assert notified == [("t", S.EXPIRED)]


def test_abort_during_a_write_defers_the_release(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("t", [1], 5.0)
    table.begin_chunk("t", [1])
    table.abort("t")
    assert table.state("t") is S.ABORTED and notified == []
    assert isinstance(table.end_chunk("t", [1], last=True, complete=True), TransferAbortedError)
    assert notified == [("t", S.ABORTED)]


def test_a_cut_short_chunk_fails_the_reservation(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("t", [1], 5.0)
    table.begin_chunk("t", [1])
    assert isinstance(table.end_chunk("t", [1], last=True, complete=False), TransportError)
    assert notified == [("t", S.FAILED)]


def test_two_open_chunks_complete_a_transfer(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    """A connection begins the next chunk while the last one's copy runs; both end in order."""
    table.expect("t", [1, 2, 3], 5.0)
    table.begin_chunk("t", [1])
    table.begin_chunk("t", [2, 3])
    assert table.end_chunk("t", [1], last=False, complete=True) is None
    assert table.state("t") is S.TRANSFERRING
    assert table.end_chunk("t", [2, 3], last=True, complete=True) is None
    assert table.state("t") is S.DONE and notified == []


def test_an_abort_with_two_open_chunks_waits_for_both(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("t", [1, 2], 5.0)
    table.begin_chunk("t", [1])
    table.begin_chunk("t", [2])
    table.abort("t")
    assert isinstance(table.end_chunk("t", [1], last=False, complete=True), TransferAbortedError)
    assert table.state("t") is S.ABORTED and notified == []
    with pytest.raises(TransferAbortedError):
        table.begin_chunk("t", [2])
    assert isinstance(table.end_chunk("t", [2], last=True, complete=True), TransferAbortedError)
    assert notified == [("t", S.ABORTED)]


def test_a_claim_while_a_chunk_is_open_is_refused(table: ReservationTable) -> None:
    table.expect("t", [1, 2], 5.0)
    table.begin_chunk("t", [1])
    with pytest.raises(TransferStateError, match="being written"):
        table.claim("t")


def test_a_last_chunk_ending_before_an_earlier_one_fails_after_both(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("t", [1, 2], 5.0)
    table.begin_chunk("t", [1])
    table.begin_chunk("t", [2])
    assert isinstance(table.end_chunk("t", [1, 2], last=True, complete=True), InvalidChunkError)
    assert table.state("t") is S.FAILED and notified == []
    assert isinstance(table.end_chunk("t", [1], last=False, complete=True), TransferStateError)
    assert notified == [("t", S.FAILED)]


def test_foreign_blocks_and_missing_blocks_fail(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("a", [1, 2], 5.0)
    with pytest.raises(InvalidChunkError, match=r"\[3\]"):
        table.begin_chunk("a", [1, 3])
    table.expect("b", [4, 5], 5.0)
    table.begin_chunk("b", [5])
    error = table.end_chunk("b", [5], last=True, complete=True)
    assert isinstance(error, InvalidChunkError) and "[4]" in str(error)
    assert notified == [("a", S.FAILED), ("b", S.FAILED)]


def test_a_lapsed_lease_refuses_chunks_and_claims_before_the_reaper_runs(
    table: ReservationTable, notified: list[tuple[str, TransferState]]
) -> None:
    table.expect("a", [1], 0.01)
    table.expect("b", [2], 0.01)
    table.begin_chunk("b", [2])
    table.end_chunk("b", [2], last=True, complete=True)
    time.sleep(0.02)
    with pytest.raises(TransferExpiredError):
        table.begin_chunk("a", [1])
    with pytest.raises(TransferExpiredError):
        table.claim("b")
    assert notified == [("a", S.EXPIRED), ("b", S.EXPIRED)]


def test_claim_and_abort_of_unknown_ids(table: ReservationTable, notified: list[tuple[str, TransferState]]) -> None:
    with pytest.raises(UnknownTransferError):
        table.claim("nobody")
    table.abort("nobody")
    with pytest.raises(UnknownTransferError):
        table.wait("nobody", 0.0)
    assert notified == []


def test_a_chunk_naming_a_block_twice_fails(table: ReservationTable, notified: list[tuple[str, TransferState]]) -> None:
    table.expect("t", [1, 2], 5.0)
    with pytest.raises(InvalidChunkError, match="repeats"):
        table.begin_chunk("t", [1, 1])
    assert notified == [("t", S.FAILED)]


def test_a_transferred_reservation_waits_for_its_claim_only_the_claim_window(
    notified: list[tuple[str, TransferState]],
) -> None:
    table = ReservationTable(8, lambda tid, state: notified.append((tid, state)), claim_window_s=0.02)
    table.expect("done", [1], 10.0)
    table.expect("transferring", [2, 3], 10.0)
    table.begin_chunk("done", [1])
    table.end_chunk("done", [1], last=True, complete=True)
    table.begin_chunk("transferring", [2])
    table.end_chunk("transferring", [2], last=False, complete=True)
    time.sleep(0.05)
    table.reap()
    # the DONE one lapsed after the claim window; the one still transferring keeps its 10 s lease
    assert notified == [("done", S.EXPIRED)]
    assert table.state("transferring") is S.TRANSFERRING


def test_a_chunk_gets_the_fence_its_reservation_was_made_with(table: ReservationTable) -> None:
    class Marker:
        def synchronize(self) -> None:
            pass

    marker = Marker()
    table.expect("fenced", [1], 1.0, fence=marker)
    table.expect("plain", [2], 1.0)
    assert table.begin_chunk("fenced", [1]) is marker
    assert table.begin_chunk("plain", [2]) is PASSED
