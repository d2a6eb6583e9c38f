"""W6 kv-transfer: the KV of N prompt tokens moved from a sender process to a receiver process over one backend.

The sender (the prefill side) runs in a spawned child over a pool of random bits; the receiver (the decode side)
runs here. Each transfer ships whole blocks, chunk by chunk as a prefill pod does (`--chunk-tokens`), between
shuffled block ids. Per size: warm-up transfers, then `--iters` timed ones, each timed in the sender from its first
`send` to the ack of the last chunk; reported as the payload bytes, effective GB/s (bytes over the median time),
p50/p99 of the time, and a bit-exact check of every block of the last transfer (the receiver's blocks are poisoned
before each one; both sides checksum their blocks, and every checksum must match).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from tqdm import tqdm

from bench.limits import DeviceLimits, measure_limits
from bench.stats import percentile
from engine.config import CacheConfig
from engine.models.shapes import MODEL_SHAPES
from kv_transfer import KVLayout, KVPoolView, KVReceiver, KVSender, TransferState, make_receiver, make_sender
from kv_transfer.pool_io import block_index, pool_words

logger = logging.getLogger(__name__)

BACKENDS = ("tcp", "cuda_ipc", "nccl")
# (sender, receiver) devices by default: cuda_ipc on one GPU, nccl from the first GPU to the second.
DEFAULT_DEVICES = {"tcp": ("cpu", "cpu"), "cuda_ipc": ("cuda:0", "cuda:0"), "nccl": ("cuda:0", "cuda:1")}
LEASE_S = 120.0
POISON_BYTE = 0x5A
_CHECKSUM_BATCH_BLOCKS = 64


def _token_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"token counts must be positive, got {text!r}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """W6's flags."""
    parser.add_argument("--kv-transfer-backend", choices=BACKENDS, default="tcp", help="the backend to measure")
    parser.add_argument(
        "--tokens", type=_token_counts, default=[512, 2048, 4096, 8192, 32768], help="comma-separated prompt lengths"
    )
    parser.add_argument("--model-shape", choices=sorted(MODEL_SHAPES), default="qwen3-8b", help="KV layout source")
    parser.add_argument("--dtype", default="bfloat16", help="KV dtype")
    parser.add_argument("--block-size", type=int, default=CacheConfig().block_size, help="tokens per KV block")
    parser.add_argument(
        "--chunk-tokens", type=int, default=2048, help="tokens per chunk, as the prefill pod ships them (0: one chunk)"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed transfers per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed transfers per size, first")
    parser.add_argument(
        "--sender-device", default=None, help="default: cpu (tcp), cuda:0 (cuda_ipc, nccl); the child's pool"
    )
    parser.add_argument("--receiver-device", default=None, help="default: cpu (tcp), cuda:0 (cuda_ipc), cuda:1 (nccl)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sender's bits and of the block ids")


def model_layout(model_shape: str, dtype: str, block_size: int) -> KVLayout:
    """The KV layout of a named model shape (engine.models.shapes)."""
    shape = MODEL_SHAPES[model_shape]
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    return KVLayout(dtype, block_size, shape["num_hidden_layers"], shape["num_key_value_heads"], head_dim)


def empty_pool(layout: KVLayout, num_blocks: int, device: torch.device) -> torch.Tensor:
    shape = (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
    return torch.empty(shape, dtype=getattr(torch, layout.dtype), device=device)


def block_checksums(words: torch.Tensor, block_ids: Sequence[int]) -> list[int]:
    """Per block, the sum of its words times odd weights (1, 3, 5, ...), wrapping mod 2^64: a changed, moved or
    swapped word changes it. The sum does not depend on the order of addition, so host and GPU agree."""
    weights = torch.arange(1, 2 * words.shape[1], 2, dtype=torch.int64, device=words.device)
    sums = []
    for start in range(0, len(block_ids), _CHECKSUM_BATCH_BLOCKS):
        index = block_index(block_ids[start : start + _CHECKSUM_BATCH_BLOCKS], words.device)
        sums.append((words.index_select(0, index).to(torch.int64) * weights).sum(dim=1))
    return [int(value) for value in torch.cat(sums).tolist()]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class _SenderSetup:
    backend: str
    layout: KVLayout
    num_blocks: int
    device: str
    seed: int


@dataclass(frozen=True, slots=True)
class _TransferOrder:
    transfer_id: str
    endpoint: str
    layout: KVLayout
    chunks: list[tuple[list[int], list[int]]]


@dataclass(frozen=True, slots=True)
class _ChecksumOrder:
    block_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Timing:
    state: TransferState
    seconds: float
    error: str


def _timed_transfer(sender: KVSender, order: _TransferOrder, device: torch.device) -> _Timing:
    _synchronize(device)
    start = time.perf_counter()
    for i, (src_ids, dst_ids) in enumerate(order.chunks):
        sender.send(order.transfer_id, order.endpoint, order.layout, src_ids, dst_ids, last=i == len(order.chunks) - 1)
    state = sender.wait(order.transfer_id, LEASE_S)
    seconds = time.perf_counter() - start
    return _Timing(state, seconds, str(sender.stats(order.transfer_id).error or ""))


def _sender_main(conn: Connection, setup: _SenderSetup) -> None:
    """The child: a pool of random bits and a sender over it, serving transfer and checksum orders until None."""
    device = torch.device(setup.device)
    pool = empty_pool(setup.layout, setup.num_blocks, device)
    words = pool_words(pool)
    words.random_(generator=torch.Generator(device).manual_seed(setup.seed))
    with make_sender(setup.backend, KVPoolView(pool, setup.layout.block_size), lease_s=LEASE_S) as sender:
        conn.send(_device_name(device))
        while (order := conn.recv()) is not None:
            if isinstance(order, _ChecksumOrder):
                conn.send(block_checksums(words, order.block_ids))
            else:
                conn.send(_timed_transfer(sender, order, device))


class _SenderProcess:
    """The spawned child and its pipe."""

    def __init__(self, setup: _SenderSetup) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=_sender_main, args=(child_conn, setup), name="w6-sender", daemon=True)
        self._process.start()
        child_conn.close()
        self.device_name: str = self._receive()

    def ask(self, order: _TransferOrder | _ChecksumOrder) -> Any:
        self._conn.send(order)
        return self._receive()

    def _receive(self) -> Any:
        if not self._conn.poll(LEASE_S * 2):
            raise TimeoutError(f"the W6 sender (pid {self._process.pid}) did not answer")
        try:
            return self._conn.recv()
        except EOFError:
            self._process.join(5.0)
            raise RuntimeError(f"the W6 sender died (exit code {self._process.exitcode})") from None

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(60.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def _chunks(src_ids: list[int], dst_ids: list[int], chunk_blocks: int) -> list[tuple[list[int], list[int]]]:
    return [
        (src_ids[i : i + chunk_blocks], dst_ids[i : i + chunk_blocks]) for i in range(0, len(src_ids), chunk_blocks)
    ]


def _measure_size(
    sender: _SenderProcess,
    receiver_words: torch.Tensor,
    receiver: KVReceiver,
    tokens: int,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> dict[str, Any]:
    layout = receiver.layout
    num_blocks = math.ceil(tokens / layout.block_size)
    pool_blocks = receiver_words.shape[0]
    src_ids = torch.randperm(pool_blocks, generator=generator)[:num_blocks].tolist()
    dst_ids = torch.randperm(pool_blocks, generator=generator)[:num_blocks].tolist()
    chunk_blocks = math.ceil(args.chunk_tokens / layout.block_size) if args.chunk_tokens > 0 else num_blocks
    chunks = _chunks(src_ids, dst_ids, chunk_blocks)
    dst_index = block_index(dst_ids, receiver_words.device)
    poison = int.from_bytes(bytes([POISON_BYTE]) * receiver_words.element_size(), "little", signed=True)
    seconds: list[float] = []
    for i in range(args.warmup + args.iters):
        transfer_id = f"w6-{tokens}-{i}"
        receiver_words.index_fill_(0, dst_index, poison)
        _synchronize(receiver_words.device)
        receiver.expect(transfer_id, dst_ids, LEASE_S)
        timing: _Timing = sender.ask(_TransferOrder(transfer_id, receiver.endpoint, layout, chunks))
        if timing.state is not TransferState.DONE or receiver.wait(transfer_id, LEASE_S) is not TransferState.DONE:
            raise RuntimeError(f"W6 transfer {transfer_id} ended {timing.state.value}: {timing.error}")
        receiver.claim(transfer_id)
        if i >= args.warmup:
            seconds.append(timing.seconds)
    sent = sender.ask(_ChecksumOrder(src_ids))
    received = block_checksums(receiver_words, dst_ids)
    num_bytes = num_blocks * layout.block_nbytes
    p50 = percentile(seconds, 50)
    return {
        "tokens": tokens,
        "num_blocks": num_blocks,
        "num_chunks": len(chunks),
        "bytes": num_bytes,
        "gb_per_s": num_bytes / p50 / 1e9,
        "latency_ms_p50": p50 * 1e3,
        "latency_ms_p99": percentile(seconds, 99) * 1e3,
        "latency_ms_min": min(seconds) * 1e3,
        "verified": sent == received,
        "mismatched_blocks": sum(a != b for a, b in zip(sent, received, strict=True)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every size of `args.tokens` over `args.kv_transfer_backend`; a JSON-able summary."""
    if args.iters < 1 or args.warmup < 0:
        raise ValueError(f"need --iters >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    backend = args.kv_transfer_backend
    sender_device = args.sender_device or DEFAULT_DEVICES[backend][0]
    receiver_device = torch.device(args.receiver_device or DEFAULT_DEVICES[backend][1])
    layout = model_layout(args.model_shape, args.dtype, args.block_size)
    sizes = sorted(args.tokens)
    pool_blocks = math.ceil(sizes[-1] / layout.block_size)
    pool = empty_pool(layout, pool_blocks, receiver_device)
    words = pool_words(pool)
    generator = torch.Generator().manual_seed(args.seed)
    results = []
    with make_receiver(backend, KVPoolView(pool, layout.block_size)) as receiver:
        sender = _SenderProcess(_SenderSetup(backend, layout, pool_blocks, sender_device, args.seed))
        try:
            for tokens in tqdm(sizes, desc=f"W6 kv-transfer over {backend}", unit="size"):
                results.append(_measure_size(sender, words, receiver, tokens, args, generator))
                logger.info("W6 %s %d tokens: %s", backend, tokens, results[-1])
        finally:
            sender.close()
    limits = _receiver_limits(receiver_device)
    if limits is not None:
        # NOTE: the copy figure counts bytes read plus written; a transfer's payload is the bytes moved once.
        for result in results:
            result["fraction_of_device_copy"] = result["gb_per_s"] / (limits.copy_bandwidth_gb_s / 2)
    return {
        "workload": "w6 kv-transfer",
        "backend": backend,
        "model_shape": args.model_shape,
        "layout": layout.to_dict(),
        "block_nbytes": layout.block_nbytes,
        "kv_bytes_per_token": layout.block_nbytes // layout.block_size,
        "chunk_tokens": args.chunk_tokens,
        "iters": args.iters,
        "warmup": args.warmup,
        "sender_device": sender_device,
        "sender_device_name": sender.device_name,
        "receiver_device": str(receiver_device),
        "receiver_device_name": _device_name(receiver_device),
        "receiver_copy_bandwidth_gb_s": None if limits is None else limits.copy_bandwidth_gb_s,
        "sizes": results,
    }


def _receiver_limits(device: torch.device) -> DeviceLimits | None:
    """The receiving GPU's measured copy bandwidth and matmul rate (None on the CPU)."""
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        return measure_limits(torch.bfloat16)
