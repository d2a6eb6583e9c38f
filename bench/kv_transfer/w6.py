"""W6 kv-transfer: the KV of N prompt tokens moved from a sender process to a receiver process over one backend.

The sender (the prefill side, `bench.kv_transfer.sender`) runs in a spawned child over a pool of random bits; the
receiver (the decode side) runs here. Each transfer ships whole blocks, chunk by chunk as a prefill pod does
(`--chunk-tokens`), between shuffled block ids. With `--concurrency N`, N transfers of the size run at once, each
its own id and blocks, their chunks sent in turn; they are timed together (first send to the last one's last ack)
and the bytes counted are all of theirs. With `--tensor-parallel-size N`, both sides are a TP=N pod: N pools of
1/N of the KV heads each, rank r's on the devices' index + r, N transfers at once under one id; the bytes counted are
all ranks'. Per size and concurrency: warm-up transfers, then `--iters` timed ones, each timed in the sender from
its first `send` to the ack of the last chunk; reported as the payload bytes, effective GB/s (bytes over the median
time), p50/p99 of the time, and a bit-exact check of every block of the last transfer(s) (the receiver's blocks are
poisoned before each one; both sides checksum their blocks, and every checksum must match).
"""

from __future__ import annotations

import argparse
import logging
import math
from typing import Any

import torch
from tqdm import tqdm

from bench.kv_transfer.sender import (
    LEASE_S,
    ChecksumOrder,
    SenderProcess,
    SenderSetup,
    Timing,
    Transfer,
    TransferOrder,
    block_checksums,
    device_name,
    rank_layouts,
    rank_views,
    synchronize,
)
from bench.reporting.stats import percentile
from engine.config import CacheConfig
from engine.models.shapes import MODEL_SHAPES
from engine.tuning.limits import DeviceLimits, measure_limits
from kv_transfer import KVLayout, KVReceiver, TransferState
from kv_transfer.factory import make_pod_receiver
from kv_transfer.pool_io import block_index, pool_words

logger = logging.getLogger(__name__)

BACKENDS = ("tcp", "cuda_ipc", "nccl")
# (sender, receiver) devices by default: cuda_ipc on one GPU, nccl from the first GPU to the second.
DEFAULT_DEVICES = {"tcp": ("cpu", "cpu"), "cuda_ipc": ("cuda:0", "cuda:0"), "nccl": ("cuda:0", "cuda:1")}
POISON_BYTE = 0x5A


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated counts, got {text!r}") from None
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"counts must be positive, got {text!r}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """W6's flags."""
    parser.add_argument("--kv-transfer-backend", choices=BACKENDS, default="tcp", help="the backend to measure")
    parser.add_argument(
        "--tokens", type=_counts, default=[512, 2048, 4096, 8192, 32768], help="comma-separated prompt lengths"
    )
    parser.add_argument(
        "--concurrency",
        type=_counts,
        default=[1],
        help="comma-separated numbers of transfers at once per size (each its own id and blocks; GB/s of them all)",
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
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks of both pods: rank r's pool (1/N of the KV heads) on the devices' index + r, N transfers at once",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sender's bits and of the block ids")


def model_layout(model_shape: str, dtype: str, block_size: int) -> KVLayout:
    """The KV layout of a named model shape (engine.models.shapes)."""
    shape = MODEL_SHAPES[model_shape]
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    return KVLayout(dtype, block_size, shape["num_hidden_layers"], shape["num_key_value_heads"], head_dim)


def _chunks(src_ids: list[int], dst_ids: list[int], chunk_blocks: int) -> list[tuple[list[int], list[int]]]:
    return [
        (src_ids[i : i + chunk_blocks], dst_ids[i : i + chunk_blocks]) for i in range(0, len(src_ids), chunk_blocks)
    ]


def _measure_size(
    sender: SenderProcess,
    receiver_words: list[torch.Tensor],
    receiver: KVReceiver,
    tokens: int,
    concurrency: int,
    args: argparse.Namespace,
    generator: torch.Generator,
) -> dict[str, Any]:
    """One size, `concurrency` transfers at once (each of its own blocks on both sides); `receiver_words`: each
    rank's pool as words."""
    layout = receiver.layout
    num_blocks = math.ceil(tokens / layout.block_size)
    pool_blocks = receiver_words[0].shape[0]
    num_moved = num_blocks * concurrency
    src_ids = torch.randperm(pool_blocks, generator=generator)[:num_moved].tolist()
    dst_ids = torch.randperm(pool_blocks, generator=generator)[:num_moved].tolist()
    chunk_blocks = math.ceil(args.chunk_tokens / layout.block_size) if args.chunk_tokens > 0 else num_blocks
    shares = [slice(j * num_blocks, (j + 1) * num_blocks) for j in range(concurrency)]
    chunks = [_chunks(src_ids[share], dst_ids[share], chunk_blocks) for share in shares]
    poison = int.from_bytes(bytes([POISON_BYTE]) * receiver_words[0].element_size(), "little", signed=True)
    seconds: list[float] = []
    for i in range(args.warmup + args.iters):
        transfers = [Transfer(f"w6-{tokens}x{concurrency}-{i}-{j}", chunks[j]) for j in range(concurrency)]
        for words in receiver_words:
            words.index_fill_(0, block_index(dst_ids, words.device), poison)
        synchronize([words.device for words in receiver_words])
        for transfer, share in zip(transfers, shares, strict=True):
            receiver.expect(transfer.transfer_id, dst_ids[share], LEASE_S)
        timing: Timing = sender.ask(TransferOrder(receiver.endpoint, layout, transfers))
        for transfer in transfers:
            state = receiver.wait(transfer.transfer_id, LEASE_S)
            if timing.state is not TransferState.DONE or state is not TransferState.DONE:
                raise RuntimeError(f"W6 transfer {transfer.transfer_id} ended {timing.state.value}: {timing.error}")
            receiver.claim(transfer.transfer_id)
        if i >= args.warmup:
            seconds.append(timing.seconds)
    sent = [value for rank in sender.ask(ChecksumOrder(src_ids)) for value in rank]
    received = [value for words in receiver_words for value in block_checksums(words, dst_ids)]
    num_bytes = num_moved * layout.block_nbytes * layout.tp_size
    p50 = percentile(seconds, 50)
    return {
        "tokens": tokens,
        "concurrency": concurrency,
        "num_blocks": num_blocks,
        "num_chunks": len(chunks[0]),
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
    layouts = rank_layouts(layout, args.tensor_parallel_size)
    sizes = sorted(args.tokens)
    concurrencies = sorted(args.concurrency)
    pool_blocks = math.ceil(sizes[-1] / layout.block_size) * concurrencies[-1]
    views = rank_views(layouts, pool_blocks, receiver_device)
    words = [pool_words(view.pool) for view in views]
    generator = torch.Generator().manual_seed(args.seed)
    results = []
    with make_pod_receiver(backend, views) as receiver:
        sender = SenderProcess(SenderSetup(backend, layouts, pool_blocks, sender_device, args.seed))
        try:
            cases = [(tokens, concurrency) for tokens in sizes for concurrency in concurrencies]
            for tokens, concurrency in tqdm(cases, desc=f"W6 kv-transfer over {backend}", unit="case"):
                results.append(_measure_size(sender, words, receiver, tokens, concurrency, args, generator))
                logger.info("W6 %s %d tokens x %d: %s", backend, tokens, concurrency, results[-1])
        finally:
            sender.close()
    limits = _receiver_limits(receiver_device)
    if limits is not None:
        # NOTE: the copy figure counts bytes read plus written; a transfer's payload is the bytes moved once. With
        # N ranks, the fraction is of one device's copy rate (the ranks' transfers run on N devices at once).
        for result in results:
            result["fraction_of_device_copy"] = result["gb_per_s"] / (limits.copy_bandwidth_gb_s / 2)
    return {
        "workload": "w6 kv-transfer",
        "backend": backend,
        "model_shape": args.model_shape,
        "layout": layout.to_dict(),
        "tensor_parallel_size": args.tensor_parallel_size,
        "block_nbytes": layout.block_nbytes,
        "kv_bytes_per_token": layout.block_nbytes // layout.block_size,
        "chunk_tokens": args.chunk_tokens,
        "concurrency": concurrencies,
        "iters": args.iters,
        "warmup": args.warmup,
        "sender_device": sender_device,
        "sender_device_name": sender.device_name,
        "receiver_device": str(receiver_device),
        "receiver_device_name": device_name(receiver_device),
        "receiver_copy_bandwidth_gb_s": None if limits is None else limits.copy_bandwidth_gb_s,
        "sizes": results,
    }


def _receiver_limits(device: torch.device) -> DeviceLimits | None:
    """The receiving GPU's measured copy bandwidth and matmul rate (None on the CPU)."""
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        return measure_limits(torch.bfloat16)
