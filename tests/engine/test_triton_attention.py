"""TritonAttentionBackend against TorchAttentionBackend (run in float64) on random paged batches (K/V stored first).

GPU tests cover the real shapes (GQA 8:1, 7:1, 4:1, 3:1, head_dim 64/128, contexts up to 8k). Without a GPU,
small cases run the same kernels in Triton's interpreter, in a child process started with TRITON_INTERPRET=1.
The whole module is skipped where triton is not installed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.backend import AttentionMetadata, store_kv
from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend, num_kv_splits
from engine.attention.triton_checks import check_attention_args
from engine.attention.triton_decode import decode_attention
from tests.engine.triton_interpreter import run_interpreted

BLOCK_SIZE = 16
NUM_LAYERS = 3
LAYER = 1
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class Batch:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    pool: torch.Tensor
    metadata: AttentionMetadata


def make_batch(
    requests: list[tuple[int, int]], heads: tuple[int, int, int], dtype: torch.dtype, device: str, seed: int
) -> Batch:
    """requests: (cached context length, query length) each; K/V of the cached context are random."""
    num_q_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(seed)
    device_gen = torch.Generator(device).manual_seed(seed)
    seq_lens = [context + q_len for context, q_len in requests]
    block_counts = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = sum(block_counts) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables: list[list[int]] = []
    slots: list[int] = []
    starts = [0]
    for (context, q_len), count in zip(requests, block_counts, strict=True):
        table, ids = ids[:count], ids[count:]
        tables.append(table + [0] * (max(block_counts) - count))
        slots.extend(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(context, context + q_len))
        starts.append(starts[-1] + q_len)
    shape = (num_blocks, NUM_LAYERS, 2, BLOCK_SIZE, num_kv_heads, head_dim)
    pool = torch.randn(shape, generator=device_gen, device=device).to(dtype)
    num_tokens = starts[-1]
    # NOTE: q/k/v are views of one fused projection, as a model hands them over (non-contiguous rows).
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=device_gen, device=device).to(dtype)
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(q_len for _, q_len in requests),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    view = (num_tokens, -1, head_dim)
    return Batch(q.view(view), k.view(view), v.view(view), pool, metadata)


def check_backend(batch: Batch, dtype: torch.dtype) -> None:
    """Triton output within tolerance of the float64 reference for every request; the pool is only read."""
    scale = batch.query.shape[2] ** -0.5
    kv_cache = batch.pool[:, LAYER]
    store_kv(batch.key, batch.value, kv_cache, batch.metadata.slot_mapping, BLOCK_SIZE)
    pool_before = batch.pool.clone()
    reference = TorchAttentionBackend(BLOCK_SIZE, scale).forward(
        batch.query.double(), kv_cache.double(), batch.metadata
    )
    output = TritonAttentionBackend(BLOCK_SIZE, scale).forward(batch.query, kv_cache, batch.metadata)
    assert output.shape == batch.query.shape and output.dtype == dtype
    assert torch.equal(batch.pool, pool_before)
    assert_close_per_request(output, reference, batch.metadata.query_start_loc_cpu, TOLERANCE[dtype])


def assert_close_per_request(output: torch.Tensor, reference: torch.Tensor, starts: list[int], tol: float) -> None:
    assert bool(torch.isfinite(output).all())
    for i in range(len(starts) - 1):
        got, want = output[starts[i] : starts[i + 1]].double(), reference[starts[i] : starts[i + 1]]
        error = float((got - want).norm() / want.norm())
        assert error < tol, f"request {i}: relative error {error:.2e} >= {tol:.0e}"


def random_requests(rng: random.Random, max_context: int) -> list[tuple[int, int]]:
    """Decodes, chunks over a cached prefix and fresh prompts, shuffled, with edge cases at block borders."""
    requests = [(rng.randrange(max_context), 1) for _ in range(6)]
    requests += [(rng.randrange(1, max_context // 2), rng.randrange(2, 300)) for _ in range(3)]
    requests += [(0, rng.randrange(2, 700)) for _ in range(2)]
    requests += [(0, 1), (BLOCK_SIZE, BLOCK_SIZE), (3 * BLOCK_SIZE - 1, 2), (max_context - 1, 1)]
    rng.shuffle(requests)
    return requests


GPU_HEADS = [(32, 4, 128), (32, 8, 128), (28, 4, 128), (16, 4, 64), (9, 3, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads", GPU_HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
def test_mixed_batch_matches_reference(heads: tuple[int, int, int], dtype: torch.dtype) -> None:
    for seed in range(2):
        requests = random_requests(random.Random(seed), max_context=8192)
        check_backend(make_batch(requests, heads, dtype, "cuda", seed), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_only_batch_splits_long_contexts(dtype: torch.dtype) -> None:
    requests = [(8191, 1), (999, 1), (16, 1), (0, 1), (4096, 1)]
    batch = make_batch(requests, (32, 8, 128), dtype, "cuda", seed=7)
    assert num_kv_splits(len(requests) * 8, batch.metadata.max_seq_len, 132) == 7
    check_backend(batch, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_prefill_only_batch(dtype: torch.dtype) -> None:
    check_backend(make_batch([(0, 2048)], (32, 8, 128), dtype, "cuda", seed=3), dtype)
    check_backend(make_batch([(0, 333), (5000, 333), (17, 333)], (32, 8, 128), dtype, "cuda", seed=4), dtype)


def check_decode_splits(batch: Batch, num_splits: int) -> None:
    """The decode kernel alone, at a forced split count: decode rows match, other rows stay untouched (NaN)."""
    m = batch.metadata
    kv_cache = batch.pool[:, LAYER]
    store_kv(batch.key, batch.value, kv_cache, m.slot_mapping, BLOCK_SIZE)
    reference = TorchAttentionBackend(BLOCK_SIZE, 0.1).forward(batch.query.double(), kv_cache.double(), m)
    output = torch.full_like(batch.query, float("nan"))
    decode_attention(batch.query, kv_cache, m.query_start_loc, m.seq_lens, m.block_table, output, 0.1, num_splits)
    starts = m.query_start_loc_cpu
    decode_rows = [starts[i] for i in range(m.num_reqs) if starts[i + 1] - starts[i] == 1]
    other_rows = [r for r in range(starts[-1]) if r not in decode_rows]
    assert bool(output[other_rows].isnan().all())
    starts = list(range(len(decode_rows) + 1))
    assert_close_per_request(output[decode_rows], reference[decode_rows], starts, TOLERANCE[batch.query.dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 5, 32])
def test_decode_split_count_does_not_change_result(num_splits: int) -> None:
    batch = make_batch([(3000, 1), (40, 1), (100, 7), (1, 1)], (32, 8, 128), torch.float32, "cuda", seed=11)
    check_decode_splits(batch, num_splits)


def run_interpreted_checks() -> None:
    """Small CPU cases for the Triton interpreter (the process must start with TRITON_INTERPRET=1)."""
    requests = [(40, 1), (0, 1), (17, 5), (0, 20), (70, 1)]
    for seed, heads in enumerate([(4, 1, 16), (6, 2, 32)]):
        check_backend(make_batch(requests, heads, torch.float32, "cpu", seed), torch.float32)
    check_decode_splits(make_batch(requests, (4, 1, 16), torch.float32, "cpu", seed=9), num_splits=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run the compiled kernels")
def test_kernels_in_triton_interpreter() -> None:
    run_interpreted("tests.engine.test_triton_attention", "run_interpreted_checks")


def test_num_kv_splits_fills_the_gpu_within_bounds() -> None:
    assert num_kv_splits(num_programs=8, max_seq_len=8192, num_sms=132) == 32
    assert num_kv_splits(num_programs=8, max_seq_len=1024, num_sms=132) == 4
    assert num_kv_splits(num_programs=512, max_seq_len=8192, num_sms=132) == 1
    assert num_kv_splits(num_programs=64, max_seq_len=4096, num_sms=132) == 5


def test_launch_checks_reject_bad_arguments() -> None:
    batch = make_batch([(3, 2)], (4, 2, 16), torch.float32, "cpu", seed=0)
    m = batch.metadata
    kv_cache = batch.pool[:, LAYER]
    args = (m.query_start_loc, m.seq_lens, m.block_table)
    assert check_attention_args(batch.query, kv_cache, torch.empty_like(batch.query), *args) == 2
    with pytest.raises(ValueError, match="not a multiple"):
        check_attention_args(batch.query[:, :3], kv_cache, torch.empty(2, 3, 16), *args)
    with pytest.raises(ValueError, match="unit stride"):
        check_attention_args(batch.query, kv_cache, torch.empty(2, 16, 4).transpose(1, 2), *args)
    with pytest.raises(ValueError, match="power of two"):
        odd = torch.empty(2, 4, 24)
        check_attention_args(odd, torch.empty(9, 2, 16, 2, 24), odd, *args)
    with pytest.raises(ValueError, match="do not match"):
        check_attention_args(batch.query, kv_cache, batch.query, m.query_start_loc[:1], m.seq_lens, m.block_table)
