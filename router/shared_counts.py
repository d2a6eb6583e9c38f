"""A table of counts the router's processes share: one row per process, summed by whoever reads.

1. The supervisor (router.supervisor) creates the table as a file in its run folder (`SharedCounts.create`), every
   count zero; each worker maps it (`SharedCounts.open`) and owns one row.
2. A process writes only its own row (`add`, `set`, `add_client_streams`), from its event loop's thread, so no lock
   is needed; a reader sums the rows (`total`, `client_streams`), and sees each count as it was before or after a
   write (aligned 8-byte slots), never torn.
3. When a worker dies, the supervisor zeroes its row (`clear_row`) before it starts the worker's successor: what the
   dead process held is held no more.
A row holds the `Total`s and a per-client table: a client id falls into one of CLIENT_BUCKETS buckets by a stable hash
(blake2b, never Python's `hash()`, so every process agrees), and the bucket counts its open streams. NOTE: clients
whose hashes share a bucket share its count: a client may be counted a neighbour's streams too (never fewer than its
own), one pair of clients in CLIENT_BUCKETS. A lone router process uses an anonymous table of one row
(`SharedCounts.local`), so that the code reading it is the same.
"""

from __future__ import annotations

import enum
import hashlib
import mmap
from pathlib import Path

CLIENT_BUCKETS = 4096
_SLOT_BYTES = 8


class Total(enum.IntEnum):
    """The named counts of a row (each its slot)."""

    RUNNING_REQUESTS = 0
    """Requests being generated (RunningRequests: GetLoad's num_running_requests)."""
    WAITING_REQUESTS = 1
    """Admitted requests waiting for their first token."""
    QUEUED_PROMPT_TOKENS = 2
    """Prompt tokens of the waiting requests."""


_ROW_SLOTS = len(Total) + CLIENT_BUCKETS


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
        self._slots[self._own(len(Total) + client_bucket(client))] += delta

    def client_streams(self, client: str) -> int:
        """The streams `client` holds open in every process (and any client sharing its bucket)."""
        return self._sum(len(Total) + client_bucket(client))

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
