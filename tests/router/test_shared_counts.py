"""The counts table of a router's processes (router.processes.shared_counts), written by real processes: each writes its
own row, every reader sums the rows exactly, a cleared row counts no more; the drain ring's window by whole seconds."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from router.processes.shared_counts import CLIENT_BUCKETS, SharedCounts, Total, client_bucket

NUM_ROWS = 3
COLLIDING_CLIENT = "c2321"
"""A client id that falls in alice's bucket (found once by search; the hash is stable, so it stays so)."""


def _write_row(path: Path, row: int, go: multiprocessing.synchronize.Event) -> None:
    """A worker's writes: row r adds r + 1 running requests, 10 * (r + 1) in flight (one by one), sets the
    prompt tokens in flight to 1000 * (r + 1), opens r + 2 streams of alice and one of bob, then closes one of
    alice's; r + 1 first tokens drain at 100 + r s."""
    go.wait()
    counts = SharedCounts.open(path, row)
    counts.add(Total.RUNNING_REQUESTS, row + 1)
    for _ in range(10 * (row + 1)):
        counts.add(Total.IN_FLIGHT_REQUESTS, 1)
    counts.set(Total.IN_FLIGHT_PROMPT_TOKENS, 1000 * (row + 1))
    counts.add_client_streams("alice", row + 2)
    counts.add_client_streams("alice", -1)
    counts.add_client_streams("bob", 1)
    counts.add_drained(100.0 + row, row + 1)
    counts.close()


def test_rows_written_by_separate_processes_sum_exactly_and_a_cleared_row_counts_no_more(tmp_path: Path) -> None:
    path = tmp_path / "counts"
    table = SharedCounts.create(path, NUM_ROWS)
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    writers = [context.Process(target=_write_row, args=(path, row, go)) for row in range(NUM_ROWS)]
    for writer in writers:
        writer.start()
    go.set()
    for writer in writers:
        writer.join(60)
    assert [writer.exitcode for writer in writers] == [0] * NUM_ROWS
    reader = SharedCounts.open(path, None)
    for view in (table, reader):
        assert (view.num_rows, view.total(Total.RUNNING_REQUESTS), view.total(Total.IN_FLIGHT_REQUESTS)) == (3, 6, 60)
        assert view.total(Total.IN_FLIGHT_PROMPT_TOKENS) == 6000
        assert (view.client_streams("alice"), view.client_streams("bob"), view.client_streams("carol")) == (6, 3, 0)
        assert view.drained(105.0) == (6, 100.0)
    table.clear_row(1)
    assert (reader.total(Total.RUNNING_REQUESTS), reader.total(Total.IN_FLIGHT_REQUESTS)) == (4, 40)
    assert (
        reader.total(Total.IN_FLIGHT_PROMPT_TOKENS),
        reader.client_streams("alice"),
        reader.client_streams("bob"),
    ) == (
        4000,
        4,
        2,
    )
    assert reader.drained(105.0) == (4, 100.0)
    reader.close()
    table.close()


def test_clients_in_one_bucket_share_its_count_and_the_hash_is_stable() -> None:
    assert (client_bucket("alice"), client_bucket("bob"), client_bucket("10.0.0.7")) == (2637, 884, 2306)
    assert client_bucket(COLLIDING_CLIENT) == client_bucket("alice")
    counts = SharedCounts.local()
    counts.add_client_streams("alice", 2)
    assert (counts.client_streams("alice"), counts.client_streams(COLLIDING_CLIENT), counts.client_streams("bob")) == (
        2,
        2,
        0,
    )
    assert all(0 <= client_bucket(f"client-{i}") < CLIENT_BUCKETS for i in range(1000))
    counts.close()


def test_a_lone_process_table_has_one_row_and_the_supervisors_view_writes_none(tmp_path: Path) -> None:
    counts = SharedCounts.local()
    counts.set(Total.RUNNING_REQUESTS, 5)
    counts.add(Total.RUNNING_REQUESTS, -2)
    assert (counts.num_rows, counts.row, counts.total(Total.RUNNING_REQUESTS)) == (1, 0, 3)
    counts.close()
    supervisor = SharedCounts.create(tmp_path / "counts", 2)
    with pytest.raises(RuntimeError, match="writes no row"):
        supervisor.add(Total.IN_FLIGHT_REQUESTS, 1)
    with pytest.raises(ValueError, match=r"row 2 is not in \[0, 2\)"):
        SharedCounts.open(tmp_path / "counts", 2)
    with pytest.raises(FileExistsError):
        SharedCounts.create(tmp_path / "counts", 2)
    supervisor.close()


def test_the_drain_ring_counts_the_last_whole_seconds_and_reuses_a_bucket_a_ring_later(tmp_path: Path) -> None:
    table = SharedCounts.create(tmp_path / "counts", 2)
    first, second = SharedCounts.open(tmp_path / "counts", 0), SharedCounts.open(tmp_path / "counts", 1)
    assert first.drained(100.0) == (0, 100.0)  # nothing drained: no earliest
    first.add_drained(100.25, 1)
    first.add_drained(100.75, 2)  # the same second: the bucket keeps its first time
    second.add_drained(103.5, 4)
    assert (first.drained(103.5), second.drained(109.99)) == ((7, 100.25), (7, 100.25))
    assert table.drained(110.0) == (4, 103.5)  # second 100 left the window: seconds 101 to 110 count
    first.add_drained(110.5, 8)  # second 110 reuses second 100's bucket
    assert (table.drained(110.5), table.drained(112.99), table.drained(113.0)) == ((12, 103.5), (12, 103.5), (8, 110.5))
    assert (table.drained(119.0), table.drained(120.0)) == ((8, 110.5), (0, 120.0))
    table.clear_row(0)
    assert table.drained(119.0) == (0, 119.0)  # the row of a dead process: what it drained counts no more
    for counts in (first, second, table):
        counts.close()
