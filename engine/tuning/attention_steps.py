"""Random attention steps on the Qwen3-8B attention shape (one layer of a paged KV pool), and the decode kernel
timed alone on them: what the decode tuner and the attention micro-benchmark share."""

from __future__ import annotations

import functools

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.triton_decode import DecodeTiles, decode_attention
from engine.tuning.timing import time_graph_ms

DEVICE = "cuda"
HQ, HKV, D, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
SCALE = D**-0.5
Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]


def kv_nbytes(pool: torch.Tensor, tokens: int) -> int:
    """K+V bytes of `tokens` tokens of one layer in the pool's dtype."""
    return tokens * 2 * HKV * D * pool.element_size()


def make_step(pool: torch.Tensor, requests: list[tuple[int, int]], gen: torch.Generator) -> Step:
    """q/k/v and metadata of a step over random distinct pool blocks; requests are (cached context, query length)."""
    seq_lens = [c + q for c, q in requests]
    counts = [-(-s // PAGE) for s in seq_lens]
    ids: list[int] = torch.randperm(pool.shape[0], generator=gen, device=DEVICE)[: sum(counts)].tolist()
    tables: list[list[int]] = []
    slots: list[int] = []
    starts = [0]
    for (context, q_len), count in zip(requests, counts, strict=True):
        table, ids = ids[:count], ids[count:]
        tables.append(table + [0] * (max(counts) - count))
        slots.extend(table[p // PAGE] * PAGE + p % PAGE for p in range(context, context + q_len))
        starts.append(starts[-1] + q_len)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        max_query_len=max(q for _, q in requests),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    q, k, v = (torch.randn(starts[-1], h, D, dtype=DTYPE, device=DEVICE, generator=gen) for h in (HQ, HKV, HKV))
    return q, k, v, metadata


def decode_kernel_ms(
    pool: torch.Tensor,
    requests: list[tuple[int, int]],
    variants: int,
    splits: int,
    tiles: DecodeTiles,
    gen: torch.Generator,
) -> float:
    """The decode kernel alone (no K/V store) at a forced split count and tile shape."""
    calls = []
    for _ in range(variants):
        q, _, _, m = make_step(pool, requests, gen)
        args = (q, pool[:, 1], m.query_start_loc, m.seq_lens, m.block_table, torch.empty_like(q), SCALE, splits)
        calls.append(functools.partial(decode_attention, *args, tiles))
    return time_graph_ms(calls)
