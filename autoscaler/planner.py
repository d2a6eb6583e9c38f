"""The autoscaler's planner, a pure policy: a `ClusterSnapshot` goes in, one `Decision` per role comes out
(prefill, decode). No I/O and no clock: time is the snapshot's `now_s`. The only state kept between calls is,
per role, the change it waits for and since when the scale-in condition has held.

Each role is decided alone, by the first of these rules that applies:
1. Pending -> hold: the connector reports the role's previous change unfinished (`ClusterSnapshot.pending`), or
   the role's active pods (draining ones are no capacity) do not yet number what the previous change asked for,
   asked less than `action_timeout_s` ago. A change that lapsed is forgotten and planning goes on.
2. Bounds: fewer active pods than the role's min -> up; more than its max -> down (whatever the load).
3. Scale-out: any load measure over its high threshold -> up at once (at max: hold).
4. Scale-in: at min -> hold. Otherwise the scale-in condition is: every measure under its low threshold, and the
   N-1 check: without its largest pod, the role would be over no high threshold. The condition must hold on every
   snapshot for `scale_down_window_s` (a snapshot without it restarts the window) -> down.
5. Otherwise -> hold.
Every change is one step (+1 or -1 pod) per call, and the driver calls once per `autoscale_interval_s`. A change
restarts the scale-in window, which stays stopped while the change is pending.

A fixed set of GPUs (`max_total_pods`, one pod per GPU): every registered pod holds a GPU (a draining one until it
deregisters), and so does a pod asked for and not yet registered. Prefill is decided first; a role whose rule 3
wants a pod when no GPU is free holds instead, and the other role, if it holds too, gives up one of its pods when it
can spare it: above its min, over no high threshold, and passing the N-1 check. The drained pod's GPU goes to the
first role, whose load still asks for it, once the pod is gone.

The load measures and their thresholds: autoscaler/signals.py and autoscaler/config.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from autoscaler.config import AutoscalerConfig
from autoscaler.signals import Signal, role_signals
from autoscaler.snapshot import ClusterSnapshot, PodSnapshot
from common.pod_registry import PodRole

Direction = Literal["up", "down", "hold"]


@dataclass(slots=True, frozen=True)
class Decision:
    """One role's outcome of a planner call; `desired` is `current` +1 (up), -1 (down) or +0 (hold)."""

    role: PodRole
    current: int
    """Active (not draining) pods of the role in the snapshot."""
    desired: int
    direction: Direction
    reason: str


@dataclass(slots=True, frozen=True)
class _Awaited:
    """A change not yet seen in the registry: the pod count it asked for, and when."""

    desired: int
    since_s: float


def _scale_in_blocker(signals: tuple[Signal, ...], current: int) -> str | None:
    """Why the role may not lose a pod now: a measure not under its low threshold, or the N-1 check; None: it may."""
    if not all(s.under_low() for s in signals):
        return "within thresholds: " + "; ".join(s.describe() for s in signals)
    for s in signals:
        if not s.fits_without_one():
            would_be = f"{s.value_without_one:.2f} > high {s.high:g}"
            return f"N-1 check fails: {s.name} would be {would_be} without one of {current} pods"
    return None


class _RolePlanner:
    """The policy for one role, with that role's state."""

    def __init__(self, role: PodRole, min_pods: int, max_pods: int, config: AutoscalerConfig) -> None:
        self.role = role
        self._min = min_pods
        self._max = max_pods
        self._config = config
        self._awaited: _Awaited | None = None
        self._low_since_s: float | None = None
        self.wants_gpu = False
        """Whether the last decision held only because no GPU was free."""

    def starting(self, snapshot: ClusterSnapshot) -> int:
        """Pods asked for and not yet registered (each will hold a GPU)."""
        awaited = self._awaited
        return 0 if awaited is None else max(0, awaited.desired - len(snapshot.active(self.role)))

    def decide(self, snapshot: ClusterSnapshot, gpu_free: bool = True) -> Decision:
        pods = snapshot.active(self.role)
        self.wants_gpu = False
        pending = self._pending(snapshot, len(pods))
        if pending is not None:
            self._low_since_s = None
            return self._hold(len(pods), pending)
        decision = self._plan(snapshot.now_s, pods)
        if decision.direction == "up" and not gpu_free:
            self.wants_gpu = True
            return self._hold(decision.current, f"no GPU free: {decision.reason}")
        if decision.direction != "hold":
            self._changed(decision, snapshot.now_s)
        return decision

    def spare_one(self, snapshot: ClusterSnapshot, taker: PodRole) -> Decision | None:
        """Down by one pod whose GPU goes to `taker`, if this role can spare it (see the module docstring)."""
        pods = snapshot.active(self.role)
        if self._pending(snapshot, len(pods)) is not None or len(pods) <= self._min:
            return None
        signals = role_signals(self.role, pods, self._config)
        if any(s.over_high() or not s.fits_without_one() for s in signals):
            return None
        load = "; ".join(s.describe() for s in signals)
        decision = self._step(len(pods), -1, f"gives its GPU to {taker}; N-1 fits: {load}")
        self._changed(decision, snapshot.now_s)
        return decision

    def _changed(self, decision: Decision, now_s: float) -> None:
        self._awaited = _Awaited(decision.desired, now_s)
        self._low_since_s = None

    def _pending(self, snapshot: ClusterSnapshot, current: int) -> str | None:
        """Why the previous change still counts as pending (rule 1); None when it does not, or there is none."""
        if self.role in snapshot.pending:
            return "pending: the connector is still applying the previous change"
        awaited = self._awaited
        if awaited is None:
            return None
        if current != awaited.desired and snapshot.now_s - awaited.since_s < self._config.action_timeout_s:
            return f"pending: waiting for {awaited.desired} pods (now {current}) since {awaited.since_s:g} s"
        # NOTE: reached, or lapsed (a new pod that never started, a pod lost meanwhile): the next change may go.
        self._awaited = None
        return None

    def _plan(self, now_s: float, pods: tuple[PodSnapshot, ...]) -> Decision:
        """Rules 2 to 5 on the role's active pods."""
        current = len(pods)
        if current < self._min:
            return self._step(current, +1, f"below min {self._min}")
        if current > self._max:
            return self._step(current, -1, f"above max {self._max}")
        signals = role_signals(self.role, pods, self._config)
        over = "; ".join(f"{s.name} {s.value:.2f} > high {s.high:g}" for s in signals if s.over_high())
        if over:
            self._low_since_s = None
            if current >= self._max:
                return self._hold(current, f"at max {self._max}: {over}")
            return self._step(current, +1, over)
        return self._plan_scale_in(now_s, current, signals)

    def _plan_scale_in(self, now_s: float, current: int, signals: tuple[Signal, ...]) -> Decision:
        """Rule 4: down once the scale-in condition has held for the whole window."""
        load = "; ".join(s.describe() for s in signals)
        blocker = f"at min {self._min}: {load}" if current <= self._min else _scale_in_blocker(signals, current)
        if blocker is not None:
            self._low_since_s = None
            return self._hold(current, blocker)
        if self._low_since_s is None:
            self._low_since_s = now_s
        held_s = now_s - self._low_since_s
        window_s = self._config.scale_down_window_s
        if held_s < window_s:
            return self._hold(current, f"low for {held_s:g} s of {window_s:g} s: {load}")
        return self._step(current, -1, f"low for {held_s:g} s and N-1 fits: {load}")

    def _step(self, current: int, delta: int, reason: str) -> Decision:
        return Decision(self.role, current, current + delta, "up" if delta > 0 else "down", reason)

    def _hold(self, current: int, reason: str) -> Decision:
        return Decision(self.role, current, current, "hold", reason)


class Planner:
    """Each role's desired pod count, one snapshot per call (the driver calls once per `autoscale_interval_s`).

    NOTE: snapshots must come in order of `now_s`; the scale-in window and the pending timeout are differences of it.
    """

    def __init__(self, config: AutoscalerConfig) -> None:
        self._max_total = config.max_total_pods
        self._prefill = _RolePlanner("prefill", config.min_prefill, config.max_prefill, config)
        self._decode = _RolePlanner("decode", config.min_decode, config.max_decode, config)

    def decide(self, snapshot: ClusterSnapshot) -> tuple[Decision, Decision]:
        """(prefill, decode): each role's decision on `snapshot`, taken independently of the other's but for the
        GPUs of `max_total_pods` (see the module docstring)."""
        free = self._free_gpus(snapshot)
        prefill = self._prefill.decide(snapshot, free > 0)
        free -= prefill.direction == "up"
        decode = self._decode.decide(snapshot, free > 0)
        if self._prefill.wants_gpu and decode.direction == "hold":
            decode = self._decode.spare_one(snapshot, "prefill") or decode
        elif self._decode.wants_gpu and prefill.direction == "hold":
            prefill = self._prefill.spare_one(snapshot, "decode") or prefill
        return prefill, decode

    def _free_gpus(self, snapshot: ClusterSnapshot) -> float:
        """GPUs no pod holds: registered pods (draining ones too) and pods asked for hold one each."""
        if not self._max_total:
            return math.inf
        starting = self._prefill.starting(snapshot) + self._decode.starting(snapshot)
        return self._max_total - len(snapshot.pods) - starting
