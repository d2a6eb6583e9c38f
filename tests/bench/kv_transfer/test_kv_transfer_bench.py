"""W6 kv-transfer (bench.kv_transfer.w6) over tcp with a tiny layout: two real processes, on the CPU."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from bench.kv_transfer.w6 import add_arguments, block_checksums, model_layout, run
from kv_transfer import KVLayout


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_w6s() -> None:
    args = _args()
    assert (args.kv_transfer_backend, args.tokens, args.model_shape, args.chunk_tokens, args.block_size) == (
        "tcp",
        [512, 2048, 4096, 8192, 32768],
        "qwen3-8b",
        2048,
        16,
    )
    assert args.concurrency == [1]
    assert _args("--concurrency", "8,1").concurrency == [8, 1]
    layout = model_layout(args.model_shape, args.dtype, args.block_size)
    assert layout == KVLayout("bfloat16", 16, 36, 8, 128)
    # 144 KiB per token (docs/workloads.md): 36 layers x (K, V) x 8 KV heads x 128 head dim x 2 bytes of bf16
    assert layout.block_nbytes // layout.block_size == 144 * 1024
    with pytest.raises(SystemExit):
        _args("--tokens", "512,x")
    with pytest.raises(SystemExit):
        _args("--concurrency", "0")


def test_checksums_see_a_swapped_word() -> None:
    words = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    swapped = words.clone()
    swapped[1, [0, 1]] = swapped[1, [1, 0]]
    assert block_checksums(words, [0, 2]) == block_checksums(swapped, [0, 2])
    assert block_checksums(words, [1]) != block_checksums(swapped, [1])


@pytest.mark.slow  # the sender child's start: ~3 s of CPU
def test_tiny_kv_moves_bit_exact_between_two_processes() -> None:
    flags = "--kv-transfer-backend tcp --model-shape tiny-qwen3 --tokens 64,40 --chunk-tokens 32 --iters 3 --warmup 1"
    result = run(_args(*flags.split()))

    assert json.loads(json.dumps(result)) == result
    assert (result["backend"], result["sender_device"], result["receiver_device"]) == ("tcp", "cpu", "cpu")
    assert result["block_nbytes"] == 2 * 2 * 16 * 2 * 32 * 2  # tiny-qwen3 in bf16: 2 layers, 2 kv heads, head_dim 32
    sizes = result["sizes"]
    assert [(s["tokens"], s["concurrency"], s["num_blocks"], s["num_chunks"], s["bytes"]) for s in sizes] == [
        (40, 1, 3, 2, 3 * 8192),
        (64, 1, 4, 2, 4 * 8192),
    ]
    for size in sizes:
        assert size["verified"] and size["mismatched_blocks"] == 0
        assert 0 < size["latency_ms_min"] <= size["latency_ms_p50"] <= size["latency_ms_p99"]
        assert size["gb_per_s"] == pytest.approx(size["bytes"] / size["latency_ms_p50"] / 1e6)


@pytest.mark.slow  # the sender child's start: ~3 s of CPU
def test_a_tp2_pod_pair_moves_each_ranks_half_of_the_heads_bit_exact() -> None:
    flags = "--model-shape tiny-qwen3 --tokens 40 --chunk-tokens 32 --iters 2 --warmup 1 --tensor-parallel-size 2"
    result = run(_args(*flags.split()))

    assert result["tensor_parallel_size"] == 2
    (size,) = result["sizes"]
    # The same KV as with one rank (40 tokens: 3 blocks of 8192 bytes), as two pools of one KV head each.
    assert (size["num_blocks"], size["num_chunks"], size["bytes"]) == (3, 2, 3 * 8192)
    assert size["verified"] and size["mismatched_blocks"] == 0
    with pytest.raises(ValueError, match="num_kv_heads 2 is not divisible by tensor_parallel_size 3"):
        run(_args(*flags.replace("size 2", "size 3").split()))


@pytest.mark.slow  # the sender child's start: ~3 s of CPU
def test_transfers_at_once_each_move_their_own_blocks_bit_exact() -> None:
    flags = "--model-shape tiny-qwen3 --tokens 40 --chunk-tokens 32 --iters 2 --warmup 1 --concurrency 3,1"
    result = run(_args(*flags.split()))

    assert result["concurrency"] == [1, 3]
    # Per transfer 3 blocks in 2 chunks; the bytes are all transfers' (the pools hold 3 transfers' blocks).
    assert [(s["concurrency"], s["num_blocks"], s["num_chunks"], s["bytes"]) for s in result["sizes"]] == [
        (1, 3, 2, 3 * 8192),
        (3, 3, 2, 9 * 8192),
    ]
    for size in result["sizes"]:
        assert size["verified"] and size["mismatched_blocks"] == 0
        assert size["gb_per_s"] == pytest.approx(size["bytes"] / size["latency_ms_p50"] / 1e6)
