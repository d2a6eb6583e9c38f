"""The processes a test started, as Linux's /proc shows them: every descendant of a process, and which still run.

A process is known by its pid and its start time, so a pid that the kernel hands to a new process later is never
taken for the old one; a zombie (exited, not reaped yet) counts as gone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ProcessId:
    pid: int
    parent_pid: int
    start_ticks: int
    """Start time in clock ticks after boot (/proc/PID/stat field 22)."""
    command: str
    """Its command line (for messages), cut to 200 characters."""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start ticks) of `pid`; None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # NOTE: field 2, the command name in parentheses, may hold spaces and parentheses itself.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def descendants(pid: int) -> list[ProcessId]:
    """Every process below `pid`: its children, theirs, and so on (breadth first)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, level = [], children.get(pid, [])
    while level:
        for child in level:
            if (stat := _stat(child)) is not None:
                found.append(ProcessId(child, stat[1], stat[2], _command(child)))
        level = [grandchild for child in level for grandchild in children.get(child, [])]
    return found


def running(process: ProcessId) -> bool:
    """The process runs (is neither gone, nor a zombie, nor another process under the same pid)."""
    stat = _stat(process.pid)
    return stat is not None and stat[0] != "Z" and stat[2] == process.start_ticks


def still_running(processes: Sequence[ProcessId], timeout_s: float) -> list[ProcessId]:
    """The processes still running once all are gone or `timeout_s` has passed, polled every 0.1 s."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in processes if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
