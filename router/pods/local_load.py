"""What this router itself has put on each pod since the registry last told it the pods' load.

Pods report their load in the registry once per heartbeat; between two reads the router would
route blind. So it counts its own work per pod: prompt tokens it sent for prefill that have not
produced their first token, completions decoding, and KV blocks reserved since the last refresh.
Per process: with `--workers N` each router process counts its own work only; the pods' reports (the registry)
cover every process's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class LocalLoad:
    """This router's outstanding work on one pod."""

    queued_prefill_tokens: int = 0
    """Prompt tokens (less their cached prefix) sent to a prefill pod, first token not yet back."""
    num_decoding: int = 0
    """Completions holding a reservation or decoding on a decode pod."""
    num_reserved_blocks: int = 0
    """Blocks reserved on a decode pod since the last registry refresh (not yet in its report)."""


_IDLE = LocalLoad()


class LocalLoads:
    """Per-pod counters of this router's outstanding work; the routing policy reads `get`."""

    def __init__(self) -> None:
        self._loads: dict[str, LocalLoad] = {}

    def get(self, pod_id: str) -> LocalLoad:
        return self._loads.get(pod_id, _IDLE)

    @contextmanager
    def prefilling(self, pod_id: str, num_tokens: int) -> Iterator[None]:
        """Counts `num_tokens` queued on the prefill pod for the duration of the block."""
        self._add(pod_id, queued_prefill_tokens=num_tokens)
        try:
            yield
        finally:
            self._add(pod_id, queued_prefill_tokens=-num_tokens)

    @contextmanager
    def decoding(self, pod_id: str, num_blocks: int) -> Iterator[None]:
        """Counts one completion on the decode pod for the block, and its `num_blocks` reserved."""
        self._add(pod_id, num_decoding=1, num_reserved_blocks=num_blocks)
        try:
            yield
        finally:
            self._add(pod_id, num_decoding=-1)

    def on_refresh(self) -> None:
        """The registry was just read: the pods' own free-block counts now include past reservations.

        NOTE: heartbeats and refreshes are not in step, so a reservation made just before a refresh
        may be missing from that report for up to one heartbeat; the decode pod's Reserve decides.
        """
        self._loads = {
            pod_id: LocalLoad(load.queued_prefill_tokens, load.num_decoding, 0)
            for pod_id, load in self._loads.items()
            if load.queued_prefill_tokens or load.num_decoding
        }

    def _add(
        self, pod_id: str, queued_prefill_tokens: int = 0, num_decoding: int = 0, num_reserved_blocks: int = 0
    ) -> None:
        load = self.get(pod_id)
        updated = LocalLoad(
            load.queued_prefill_tokens + queued_prefill_tokens,
            load.num_decoding + num_decoding,
            load.num_reserved_blocks + num_reserved_blocks,
        )
        if updated == _IDLE:
            self._loads.pop(pod_id, None)
        else:
            self._loads[pod_id] = updated
