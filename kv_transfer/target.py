"""Where one request's prompt KV goes: the blocks a decode pod reserved, and how a prefill pod reaches them.

One value type for the whole system: the decode pod makes it (Reserve), the router carries it, the prefill pod
ships into it. Protobuf conversion lives at the pods' boundary (`pod.convert`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_transfer.layout import KVLayout


@dataclass(slots=True, frozen=True)
class KVTarget:
    """Blocks reserved on a decode pod for a request's prompt KV (DecodeService.Reserve's answer)."""

    transfer_id: str
    backend: str
    endpoint: str
    """Where the decode pod's KV receiver listens."""
    block_ids: tuple[int, ...]
    layout: KVLayout
    lease_s: float | None = None
    """How long the reservation holds without a chunk (None: unknown)."""
    generation: int = 0
    """Generation of the decode pod that reserved the blocks (0: unknown). NOTE: a pod restarted under the same
    address has a new generation; a target of the old one is stale, and its transfer id unknown to the new one."""
