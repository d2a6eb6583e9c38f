"""A table of counts the router's processes share: one row per process, summed by whoever reads.

1. The supervisor (router.processes.supervisor) creates the table as a file in its run folder (`SharedCounts.create`),
   every count zero; each worker maps it (`SharedCounts.open`) and owns one row.
2. A process writes only its own row (`add`, `set`, `add_client_streams`, `add_drained`), from its event loop's
   thread, so no lock is needed; a reader sums the rows (`total`, `client_streams`, `drained`), and sees each count as
   it was before or after a write (aligned 8-byte slots), never torn.
3. When a worker dies, the supervisor zeroes its row (`clear_row`) before it starts the worker's successor: what the
   dead process held is held no more.
A row holds the `Total`s and a per-client table: a client id falls into one of CLIENT_BUCKETS buckets by a stable hash
(blake2b, never Python's `hash()`, so every process agrees), and the bucket counts its open streams. NOTE: clients
whose hashes share a bucket share its count: a client may be counted a neighbour's streams too (never fewer than its
own), one pair of clients in CLIENT_BUCKETS. A row also holds a ring of DRAIN_BUCKETS one-second buckets of what
drained (router.admission.admission_state: calls that got their first token): each bucket holds its second's amount and
the time its first amount drained; a bucket is reused DRAIN_BUCKETS seconds later, its amount zeroed before its time
moves on (so that a reader never counts an old second's amount as a new one's). Times are `time.monotonic()`
(CLOCK_MONOTONIC: one clock for every process of the host). A lone router process uses an anonymous table of one row
(`SharedCounts.local`), so that the code reading it is the same.
"""

from __future__ import annotations

import enum
import hashlib
import mmap
from pathlib import Path

from pod.drain_rate import DRAIN_WINDOW_S

CLIENT_BUCKETS = 4096
DRAIN_BUCKETS = 10
"""One-second buckets of the drain ring: `drained` looks back over the last DRAIN_WINDOW_S, by whole seconds."""
_DRAIN_BUCKET_NS = round(DRAIN_WINDOW_S * 1e9) // DRAIN_BUCKETS
_SLOT_BYTES = 8


class Total(enum.IntEnum):
    """The named counts of a row (each its slot)."""

    RUNNING_REQUESTS = 0
    """Requests being generated (RunningRequests: GetLoad's num_running_requests)."""
    QUEUED_REQUESTS = 1
    """Calls in the router not yet sent on to the pods: tokenizing, or in the wait queue
    (router.admission.admission_state)."""
    IN_FLIGHT_REQUESTS = 2
    """Calls sent on to the pods and waiting for their first token."""
    IN_FLIGHT_PROMPT_TOKENS = 3
    """The prompt tokens of the calls in flight."""


_CLIENTS = len(Total)
_FIRST_DRAINED = _CLIENTS + CLIENT_BUCKETS
_DRAINED = _FIRST_DRAINED + DRAIN_BUCKETS
_ROW_SLOTS = _DRAINED + DRAIN_BUCKETS


def client_bucket(client: str) -> int:
    """The bucket of `client`'s streams, the same in every process."""
    digest = hashlib.blake2b(client.encode(errors="replace"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % CLIENT_BUCKETS


class SharedCounts:
    """The table mapped in this process; `row` is the row it writes (None: the supervisor's view, which only
    reads and clears rows)."""

    def __init__(self, mapping: mmap.mmap, row: int | None) -> None:
        self._mmap = mapping
        self._slots = memoryview(mapping).cast("q")
        self.num_rows = len(self._slots) // _ROW_SLOTS
        if row is not None and not 0 <= row < self.num_rows:
            raise ValueError(f"row {row} is not in [0, {self.num_rows})")
        self.row = row

    @classmethod
    def create(cls, path: Path, num_rows: int) -> SharedCounts:
        """A new table of `num_rows` zero rows in the file `path` (the supervisor's view)."""
        with path.open("xb") as file:
            file.truncate(num_rows * _ROW_SLOTS * _SLOT_BYTES)
        return cls.open(path, None)

    @classmethod
    def open(cls, path: Path, row: int | None) -> SharedCounts:
        """The table in `path`, writing `row`."""
        with path.open("r+b") as file:
            return cls(mmap.mmap(file.fileno(), 0), row)

    @classmethod
    def local(cls) -> SharedCounts:
        """An anonymous table of one row, written by this process (a lone router)."""
        return cls(mmap.mmap(-1, _ROW_SLOTS * _SLOT_BYTES), 0)

    def add(self, total: Total, delta: int) -> None:
        self._slots[self._own(int(total))] += delta

    def set(self, total: Total, value: int) -> None:
        self._slots[self._own(int(total))] = value

    def total(self, total: Total) -> int:
        """`total` summed over every row."""
        return self._sum(int(total))

    def add_client_streams(self, client: str, delta: int) -> None:
        """`client` opened (`delta` > 0) or closed streams in this process."""
        self._slots[self._own(_CLIENTS + client_bucket(client))] += delta

    def client_streams(self, client: str) -> int:
        """The streams `client` holds open in every process (and any client sharing its bucket)."""
        return self._sum(_CLIENTS + client_bucket(client))

    def add_drained(self, when: float, amount: int) -> None:
        """`amount` drained in this process at `when` (a `time.monotonic()` time)."""
        when_ns = round(when * 1e9)
        second = when_ns // _DRAIN_BUCKET_NS
        first = self._own(_FIRST_DRAINED + second % DRAIN_BUCKETS)
        drained = self._own(_DRAINED + second % DRAIN_BUCKETS)
        if self._slots[first] // _DRAIN_BUCKET_NS != second or not self._slots[drained]:
            # NOTE: the amount first, then the time: a reader sees the old second's time with any amount (out of its
            # window), or this second's time with this second's amount.
            self._slots[drained] = 0
            self._slots[first] = when_ns
        self._slots[drained] += amount

    def drained(self, now: float) -> tuple[int, float]:
        """What drained in every process within the last DRAIN_WINDOW_S before `now` (by whole seconds: the
        buckets of the last DRAIN_BUCKETS seconds, this one included), and when the earliest of it drained (`now`
        when nothing did)."""
        oldest_second = round(now * 1e9) // _DRAIN_BUCKET_NS - DRAIN_BUCKETS + 1
        total, earliest_ns = 0, round(now * 1e9)
        for row in range(self.num_rows):
            start = row * _ROW_SLOTS
            for bucket in range(DRAIN_BUCKETS):
                amount, first_ns = self._slots[start + _DRAINED + bucket], self._slots[start + _FIRST_DRAINED + bucket]
                if amount and first_ns // _DRAIN_BUCKET_NS >= oldest_second:
                    total += amount
                    earliest_ns = min(earliest_ns, first_ns)
        return total, earliest_ns / 1e9

    def clear_row(self, row: int) -> None:
        """Zero every count of `row` (its process is gone)."""
        start = row * _ROW_SLOTS
        self._slots[start : start + _ROW_SLOTS] = memoryview(bytes(_ROW_SLOTS * _SLOT_BYTES)).cast("q")

    def close(self) -> None:
        self._slots.release()
        self._mmap.close()

    def _own(self, slot: int) -> int:
        if self.row is None:
            raise RuntimeError("the supervisor's view of the counts writes no row")
        return self.row * _ROW_SLOTS + slot

    def _sum(self, slot: int) -> int:
        return sum(self._slots[row * _ROW_SLOTS + slot] for row in range(self.num_rows))
