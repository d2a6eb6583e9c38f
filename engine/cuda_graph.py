"""CUDA graphs for decode batches: captured once per bucketed batch size, replayed with padding.

A decode step of a small model is hundreds of short kernels; replaying them from a graph removes the
per-kernel launch and the per-op Python cost. Inputs live in static buffers that each replay refills;
padding rows write their K/V nowhere (slot -1) and attend over one token, so they cost almost nothing.
"""

from __future__ import annotations

import bisect

import torch
from tqdm import tqdm

from engine.attention.backend import AttentionMetadata
from engine.models.llama import LlamaForCausalLM


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (at most 512)."""
    limit = min(max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4, 8) if s <= limit] + list(range(16, limit + 1, 16))
    return sizes if sizes[-1] == limit else [*sizes, limit]


class CudaGraphRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        max_bs = self.sizes[-1]
        device = next(model.parameters()).device
        max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.block_table = torch.zeros((max_bs, max_blocks), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def _metadata(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_table=self.block_table[:bs],
            slot_mapping=self.slot_mapping[:bs],
            max_query_len=1,
            # NOTE: a bound, not the batch's value: the captured kernels must serve any context length.
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=[1] * bs,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        return self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches, self._metadata(bs))

    @torch.inference_mode()
    def capture(self, show_progress: bool = True) -> None:
        pool = None
        for bs in tqdm(
            list(reversed(self.sizes)), desc="capturing CUDA graphs", unit="graph", disable=not show_progress
        ):
            self._forward(bs)  # warm-up: autotuning and lazy allocations happen outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        seq_lens: list[int],
        block_table: list[list[int]],
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of a decode batch of n <= max_batch_size requests."""
        n = len(input_ids)
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        width = max(len(row) for row in block_table)
        host = torch.tensor([input_ids, positions, slot_mapping, seq_lens], dtype=torch.int64)
        self.input_ids[:n].copy_(host[0], non_blocking=True)
        self.positions[:n].copy_(host[1], non_blocking=True)
        self.slot_mapping[:n].copy_(host[2], non_blocking=True)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(host[3], non_blocking=True)
        self.seq_lens[n:bs].fill_(1)
        table = torch.tensor([row + [0] * (width - len(row)) for row in block_table], dtype=torch.int32)
        self.block_table[:n, :width].copy_(table, non_blocking=True)
        self.block_table[n:bs].zero_()
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
