"""CPU seconds of the cluster's processes, read from Linux /proc: where a served request's CPU time goes.

A pod is two processes: its front (gRPC, admission, the registry) and its engine core (the step loop, the KV
sender or receiver), a child of the front. `CpuSnapshot` reads every process once, so that the front's own time
and its children's time (the core and its workers) come from one pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """User + system CPU seconds and the parent of every live process, at one moment."""

    cpu_s: Mapping[int, float]
    parents: Mapping[int, int]

    @classmethod
    def take(cls) -> CpuSnapshot:
        ticks = os.sysconf("SC_CLK_TCK")
        parents: dict[int, int] = {}
        cpu_s: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(fields[1])
            cpu_s[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
        return cls(cpu_s, parents)

    def own(self, pid: int) -> float:
        """CPU seconds of process `pid` alone (0 when it is gone)."""
        return self.cpu_s.get(pid, 0.0)

    def tree(self, pid: int) -> float:
        """CPU seconds of process `pid` and its live descendants."""
        tree, frontier = {pid}, [pid]
        while frontier:
            children = [p for p, parent in self.parents.items() if parent in frontier and p not in tree]
            tree.update(children)
            frontier = children
        return sum(self.cpu_s.get(p, 0.0) for p in tree)


def pod_cpu_ms_per_request(
    before: CpuSnapshot, after: CpuSnapshot, pod_pids: Mapping[str, int], num_requests: int
) -> dict[str, dict[str, float]]:
    """Each pod's CPU milliseconds per request between two snapshots: its front alone and its engine core (the
    front's descendants). A process that started or ended between them counts only what `after` shows."""
    out: dict[str, dict[str, float]] = {}
    for pod_id, pid in pod_pids.items():
        front = after.own(pid) - before.own(pid)
        core = (after.tree(pid) - after.own(pid)) - (before.tree(pid) - before.own(pid))
        out[pod_id] = {"front": front / num_requests * 1000, "core": core / num_requests * 1000}
    return out
