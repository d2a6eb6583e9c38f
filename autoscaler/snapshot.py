"""What the planner sees: `PodSnapshot`, one pod's load as its registry entry reports it, and `ClusterSnapshot`,
every pod at one instant with the roles whose last change the connector is still applying."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from common.errors import InvalidArgumentError
from common.pod_registry import PodInfo, PodRole


@dataclass(slots=True, frozen=True)
class PodSnapshot:
    """One pod's load at the last heartbeat (the fields of `PodInfo`)."""

    role: PodRole
    pod_id: str
    draining: bool = False
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_reserved_blocks: int = 0
    """Decode: of the blocks not free, those reserved for requests not admitted yet (0 where not reported)."""
    queued_prompt_tokens: int | None = None
    """Prefill: prompt tokens not yet computed; None where the pod does not report them."""
    step_ms: float = 0.0
    """Decode: the engine's time per step (per output token) while requests run; 0 when idle or not reported."""

    def __post_init__(self) -> None:
        if self.role not in get_args(PodRole):
            raise InvalidArgumentError("role", f"must be one of {get_args(PodRole)}, got {self.role!r}")
        for name in (
            "num_running",
            "num_waiting",
            "num_free_blocks",
            "num_total_blocks",
            "num_reserved_blocks",
            "queued_prompt_tokens",
            "step_ms",
        ):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidArgumentError(name, f"must be >= 0, got {value}")

    @classmethod
    def from_pod_info(cls, info: PodInfo) -> PodSnapshot:
        """The snapshot of a registry entry."""
        return cls(
            role=info.role,
            pod_id=info.pod_id,
            draining=info.draining,
            num_running=info.num_running,
            num_waiting=info.num_waiting,
            num_free_blocks=info.num_free_blocks,
            num_total_blocks=info.num_total_blocks,
            num_reserved_blocks=info.num_reserved_blocks,
            queued_prompt_tokens=info.queued_prompt_tokens,
            step_ms=info.step_ms,
        )

    @property
    def num_admitted_blocks(self) -> int:
        """Blocks held by admitted (waiting or running) requests: the blocks not free, less the reserved ones."""
        return max(0, self.num_total_blocks - self.num_free_blocks - self.num_reserved_blocks)


@dataclass(slots=True, frozen=True)
class ClusterSnapshot:
    """Every registered pod at `now_s`, and the roles whose previous change the connector reports unfinished."""

    now_s: float
    """Seconds on a monotonic clock of the caller's choosing; the planner only takes differences."""
    pods: tuple[PodSnapshot, ...]
    pending: frozenset[PodRole] = frozenset()

    def active(self, role: PodRole) -> tuple[PodSnapshot, ...]:
        """The pods of `role` that count as capacity: every one not draining."""
        return tuple(p for p in self.pods if p.role == role and not p.draining)
