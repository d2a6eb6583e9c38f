"""The cuda_ipc pools of this process, by key.

NOTE: CUDA refuses to open an IPC handle in the process that exported it, so a receiver in the sender's own process
(a colocated pod, the contract tests) uses the sender's tensor itself, found here.
"""

from __future__ import annotations

import os
import threading
import uuid

import torch

from kv_transfer.state import TransportError

_BOOT_ID = uuid.uuid4().hex
_lock = threading.Lock()
_pools: dict[str, torch.Tensor] = {}


def process_id() -> str:
    """This process's id, unique across hosts and restarts (a forked child has its own pid)."""
    return f"{os.getpid()}-{_BOOT_ID}"


def register(key: str, rows: torch.Tensor) -> None:
    with _lock:
        _pools[key] = rows


def unregister(key: str) -> None:
    with _lock:
        _pools.pop(key, None)


def lookup(key: str) -> torch.Tensor:
    """The rows registered under `key`; TransportError once their sender closed."""
    with _lock:
        rows = _pools.get(key)
    if rows is None:
        raise TransportError(f"no cuda_ipc sender pool {key!r} in this process (its sender closed)")
    return rows
