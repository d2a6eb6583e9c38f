"""Tokenization off the event loop: a pool of worker processes, each holding the model's tokenizer.

Each worker talks to the router over its own socket pair, read and written by the event loop
directly: one request costs a pickled string out and a list of ids back, with no executor threads
in between (a ProcessPoolExecutor round trip costs ~3-10x more). Requests go to the worker with
the fewest outstanding ones; a request's queue time (behind the worker's earlier ones: a worker
answers in order) goes to the pool's `on_queue_time` hook. Workers are forked from a forkserver
that has imported this module (and transformers) once, so starting N workers costs one import, not N; they never
outlive the router (`common.child_process`).
After an input of more than `TRIM_AFTER_CHARS` a worker hands the heap its tokenization grew back to
the OS (glibc's malloc_trim): without it one 2 MB prompt left a worker at ~2.5x its baseline memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import pickle
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from common.child_process import die_with_parent
from common.errors import InvalidArgumentError, UnavailableError
from router.tokenizer.tokenizer_worker import ERROR, INVALID, OK, TokenizerWorker

logger = logging.getLogger(__name__)

TRIM_AFTER_CHARS = 64 * 1024
"""Input size (characters) above which a worker returns its freed heap to the OS after answering."""


@dataclass(slots=True, frozen=True)
class ChatMessage:
    """One message of a chat conversation, as the chat template reads it."""

    role: str
    content: str
    parts: tuple[str | bytes, ...] = ()
    """The content as parts, in order, when it holds images (content is then empty): text, and images' bytes."""

    @property
    def images(self) -> tuple[bytes, ...]:
        return tuple(part for part in self.parts if isinstance(part, bytes))

    def template_input(self) -> dict[str, Any]:
        """The message as chat templates read it: image parts as `{"type": "image"}` (the template writes the
        model's image token there)."""
        if not self.parts:
            return {"role": self.role, "content": self.content}
        parts = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in self.parts]
        return {"role": self.role, "content": parts}


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The model's fast tokenizer (tokenizer.json + tokenizer_config.json + chat template).

    NOTE: PreTrainedTokenizerFast, not AutoTokenizer: AutoTokenizer imports torch (seconds of start-up
    and hundreds of MB per process) and the router needs none of it.
    """
    tokenizer: PreTrainedTokenizerBase = PreTrainedTokenizerFast.from_pretrained(folder)
    return tokenizer


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # NOTE: the Rust tokenizer directly: the same ids as tokenizer.encode(text), without its Python overhead.
    ids: list[int] = tokenizer.backend_tokenizer.encode(text, add_special_tokens=True).ids
    return ids


def _encode_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    rendered: str = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # NOTE: the template wrote the special tokens (BOS, role markers) itself; transformers adds none either.
    ids: list[int] = tokenizer.backend_tokenizer.encode(rendered, add_special_tokens=False).ids
    return ids


_OPERATIONS: dict[str, Callable[[PreTrainedTokenizerBase, Any], list[int]]] = {"encode": _encode, "chat": _encode_chat}


def _input_chars(arg: str | list[dict[str, Any]]) -> int:
    if isinstance(arg, str):
        return len(arg)
    return sum(len(m["role"]) + sum(len(p.get("text", "")) for p in _parts(m["content"])) for m in arg)


def _parts(content: str | list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"text": content}] if isinstance(content, str) else content


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0) (every arena, the tokenizer's threads' included); a no-op without glibc."""
    libc_name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None) if libc_name else None
    return (lambda: None) if trim is None else (lambda: trim(0))


def _worker_main(conn: Connection, folder: Path) -> None:
    """A worker process: load the tokenizer, say ready, then answer (id, op, arg) frames until EOF."""
    # NOTE: the parent is the router's forkserver, which exits with the router (multiprocessing's alive pipe): a
    # worker busy with a long input goes at once too. One forked as the forkserver died sees its socket's EOF.
    die_with_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        tokenizer = load_tokenizer(folder)
    except Exception as exc:
        conn.send_bytes(pickle.dumps((0, ERROR, f"loading the tokenizer from {folder} failed: {exc!r}")))
        return
    conn.send_bytes(pickle.dumps((0, OK, os.getpid())))
    release_memory = _malloc_trim()
    while True:
        try:
            request_id, op, arg = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        reply: tuple[int, str, Any]
        try:
            reply = (request_id, OK, _OPERATIONS[op](tokenizer, arg))
        except TemplateError as exc:
            reply = (request_id, INVALID, str(exc))
        except Exception as exc:
            reply = (request_id, ERROR, repr(exc))
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        # NOTE: trimmed before the reply goes out, so the worker is back at its baseline when the caller has it.
        if _input_chars(arg) > TRIM_AFTER_CHARS:
            del arg, reply
            release_memory()
        conn.send_bytes(data)


class TokenizerPool:
    """`size` worker processes tokenizing prompts for the router; async API, safe to share."""

    def __init__(self, model_folder: Path, size: int, on_queue_time: Callable[[float], None] | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._folder = model_folder
        self._size = size
        self._on_queue_time = on_queue_time
        self._workers: list[TokenizerWorker] = []
        self._replacing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Start every worker and wait until each has loaded the tokenizer."""
        workers = await asyncio.gather(*(self._start_worker() for _ in range(self._size)))
        self._workers = list(workers)
        logger.info("tokenizer pool ready: %d workers (pids %s)", self._size, [w.process.pid for w in workers])

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [worker.process.pid for worker in self._workers if worker.alive and worker.process.pid is not None]

    async def encode(self, text: str) -> list[int]:
        """Token ids of a text prompt, special tokens (e.g. BOS) added as the tokenizer does."""
        ids: list[int] = await self._call("encode", text)
        return ids

    async def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of a conversation rendered by the chat template, with the generation prompt.

        Raises InvalidArgumentError("messages", ...) when the template rejects the conversation.
        """
        ids: list[int] = await self._call("chat", [m.template_input() for m in messages])
        return ids

    async def aclose(self) -> None:
        """Stop the workers (each exits when its socket closes)."""
        self._closed = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        workers, self._workers = self._workers, []
        await asyncio.gather(*(worker.aclose() for worker in workers))

    async def _call(self, op: str, arg: Any) -> Any:
        if not self._workers:
            raise RuntimeError("TokenizerPool.start() was not awaited")
        worker = min(self._workers, key=lambda w: (not w.alive, w.num_pending))
        if not worker.alive:
            raise UnavailableError("no tokenizer worker is running; retry")
        status, value, queue_s = await worker.call(op, arg)
        if self._on_queue_time is not None:
            self._on_queue_time(queue_s)
        if status == INVALID:
            raise InvalidArgumentError("messages", f"the chat template rejected the messages: {value}")
        if status != OK:
            raise RuntimeError(f"tokenizer worker failed on {op}: {value}")
        return value

    async def _start_worker(self) -> TokenizerWorker:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        parent_end, child_end = context.Pipe(duplex=True)
        process = context.Process(
            target=_worker_main, args=(child_end, self._folder), name="pdserve-tokenizer", daemon=True
        )
        process.start()
        child_end.close()
        # NOTE: a duplex Pipe is a Unix socket pair; the event loop reads and writes the router's end.
        sock = socket.socket(fileno=os.dup(parent_end.fileno()))
        parent_end.close()
        reader, writer = await asyncio.open_connection(sock=sock)
        worker = TokenizerWorker(process, reader, writer, on_exit=self._replace)
        await worker.wait_ready()
        return worker

    def _replace(self, dead: TokenizerWorker) -> None:
        """Start a worker in place of `dead` in the background (once per dead worker)."""
        if self._closed or any(task.get_name() == f"replace-{id(dead)}" for task in self._replacing):
            return

        async def replace() -> None:
            worker = await self._start_worker()
            self._workers = [worker if w is dead else w for w in self._workers]
            await dead.aclose()

        task = asyncio.create_task(replace(), name=f"replace-{id(dead)}")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)
