"""A KV sender in a spawned child process, driven over a pipe: the two-process tests of the device backends.

The child builds `random_pool(num_blocks, seed=seed)` on its device (the parent rebuilds it on the host to check
what arrived) and a sender of the named backend over it, then runs the sender's methods as the parent calls them.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from common.child_process import die_with_parent
from kv_transfer import KVLayout, KVPoolView, KVSender, LayoutMismatchError, TransferState, TransferStats, make_sender
from tests.kv_transfer.pools import BLOCK_SIZE, random_pool

CALL_TIMEOUT_S = 120.0
REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class SenderSpec:
    backend: str
    device: str
    num_blocks: int
    seed: int


@dataclass(frozen=True)
class RemoteStats:
    """`TransferStats` as plain values: the error by class name, message and (layout errors) differing fields."""

    state: TransferState
    num_bytes: int
    num_blocks: int
    num_chunks: int
    error_type: str | None
    error_message: str
    error_fields: tuple[str, ...]


@dataclass(frozen=True)
class _Failed:
    error_type: str
    message: str


def _plain(result: Any) -> Any:
    if not isinstance(result, TransferStats):
        return result
    error = result.error
    fields = error.fields if isinstance(error, LayoutMismatchError) else ()
    name = type(error).__name__ if error is not None else None
    return RemoteStats(
        result.state, result.num_bytes, result.num_blocks, result.num_chunks, name, str(error or ""), fields
    )


def _serve(conn: Connection, spec: SenderSpec, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    pool = random_pool(spec.num_blocks, seed=spec.seed).to(spec.device)
    sender: KVSender = make_sender(spec.backend, KVPoolView(pool, BLOCK_SIZE))
    with sender:
        conn.send("ready")
        while (call := conn.recv()) is not None:
            method, args = call
            try:
                conn.send(_plain(getattr(sender, method)(*args)))
            except Exception as error:
                conn.send(_Failed(type(error).__name__, str(error)))


class RemoteSender:
    """The parent's handle on the child's sender: the KVSender methods the tests need, with plain results."""

    def __init__(self, spec: SenderSpec) -> None:
        # NOTE: the child imports this module by name, on the parent's sys.path, which pytest's importlib mode leaves
        # without the repository root.
        if REPO_ROOT not in sys.path:
            sys.path.append(REPO_ROOT)
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child_conn, spec, os.getpid()), name="kv-remote-sender", daemon=True
        )
        self._process.start()
        child_conn.close()
        self._receive()

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: list[int],
        dst_block_ids: list[int],
        last: bool,
    ) -> None:
        self._call("send", transfer_id, endpoint, layout, src_block_ids, dst_block_ids, last)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        state: TransferState = self._call("wait", transfer_id, timeout_s)
        return state

    def state(self, transfer_id: str) -> TransferState:
        state: TransferState = self._call("state", transfer_id)
        return state

    def abort(self, transfer_id: str) -> None:
        self._call("abort", transfer_id)

    def stats(self, transfer_id: str) -> RemoteStats:
        stats: RemoteStats = self._call("stats", transfer_id)
        return stats

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(30.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def _call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        result = self._receive()
        if isinstance(result, _Failed):
            raise AssertionError(f"the child's {method} raised {result.error_type}: {result.message}")
        return result

    def _receive(self) -> Any:
        if not self._conn.poll(CALL_TIMEOUT_S):
            raise TimeoutError(f"the sender child (pid {self._process.pid}) did not answer in {CALL_TIMEOUT_S}s")
        try:
            return self._conn.recv()
        except EOFError:
            self._process.join(5.0)
            raise AssertionError(f"the sender child died (exit code {self._process.exitcode})") from None
