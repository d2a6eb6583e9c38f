"""How `pdserve status` finds the cluster that `pdserve up` runs on this machine: a note per running `pdserve up`.

1. `pdserve up`, once its cluster serves, writes its note (`ClusterNote.write`): a `RunningCluster` as JSON, named
   after its pid, in `notes_folder()` (`$XDG_RUNTIME_DIR/pdserve/clusters`, else `~/.cache/pdserve/clusters`), mode
   0600 in a folder of mode 0700 (the Redis URL may carry a password). It holds an exclusive lock (flock) on the
   note for as long as it runs: the kernel drops the lock when the process ends, however it ends.
2. `pdserve status` without --redis-url reads the notes (`running_clusters`): a locked note is a running cluster; an
   unlocked one was left by a `pdserve up` that could not remove it (SIGKILL), and is deleted unread.
3. `pdserve up` deletes its note once its cluster has stopped (`ClusterNote.remove`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import UnavailableError
from common.redis_client import redact

if TYPE_CHECKING:
    from cli.cluster import LocalCluster


@dataclass(frozen=True, slots=True)
class RunningCluster:
    """What `pdserve status` needs to show a cluster that `pdserve up` runs."""

    pid: int
    """The `pdserve up` process."""
    router_address: str
    """host:port of the router."""
    redis_url: str
    """The cluster's Redis (the pod registry)."""
    tls_ca: str | None = None
    """The CA that the router's certificate is checked against (`pdserve up --secure`); None: plain text."""

    @classmethod
    def of(cls, cluster: LocalCluster) -> RunningCluster:
        """The note of `cluster`, which this process runs."""
        credentials = cluster.config.credentials
        ca = str(credentials.ca) if credentials is not None else None
        return cls(os.getpid(), cluster.router_address, cluster.redis_url, ca)

    def describe(self) -> str:
        return f"router {self.router_address}, Redis {redact(self.redis_url)} (pdserve up, pid {self.pid})"


def notes_folder(environ: Mapping[str, str]) -> Path:
    """Where the notes are: `$XDG_RUNTIME_DIR/pdserve/clusters`, else `~/.cache/pdserve/clusters`."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path(environ.get("HOME") or Path.home()) / ".cache"
    return base / "pdserve" / "clusters"


class ClusterNote:
    """The note of a running cluster, written and locked by its `pdserve up` (see the module docstring)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def write(cls, folder: Path, cluster: RunningCluster) -> ClusterNote:
        """Write and lock `cluster`'s note in `folder` (made if missing)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = folder / f"{cluster.pid}.json"
        partial = folder / f".{cluster.pid}.json.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # NOTE: locked before it gets its name, and renamed whole: a reader never sees an unlocked or partial note.
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(asdict(cluster)).encode())
        os.rename(partial, path)
        return cls(path, fd)

    def remove(self) -> None:
        """Delete the note and drop its lock."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)


def running_clusters(folder: Path) -> list[RunningCluster]:
    """The clusters whose `pdserve up` runs, in pid order; deletes the notes of those that died."""
    found = []
    for path in folder.glob("*.json"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with os.fdopen(fd) as note:
                found.append(RunningCluster(**json.load(note)))
            continue
        path.unlink(missing_ok=True)
        os.close(fd)
    return sorted(found, key=lambda cluster: cluster.pid)


def the_running_cluster(folder: Path) -> RunningCluster:
    """The one cluster `pdserve up` runs on this machine; UnavailableError when none or several run."""
    clusters = running_clusters(folder)
    if len(clusters) == 1:
        return clusters[0]
    if not clusters:
        raise UnavailableError(
            "no `pdserve up` cluster is running on this machine; start one, or name a cluster's Redis with "
            "--redis-url URL (or PDSERVE_REDIS_URL)"
        )
    listed = "; ".join(cluster.describe() for cluster in clusters)
    raise UnavailableError(
        f"{len(clusters)} `pdserve up` clusters are running on this machine ({listed}); name one's Redis with "
        "--redis-url URL"
    )
