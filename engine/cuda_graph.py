"""CUDA graphs for decode batches: captured once per bucketed batch size, replayed with padding.

A decode step of a small model is hundreds of short kernels; replaying them from a graph removes the
per-kernel launch and the per-op Python cost. The graphs read the input batch's persistent device buffers,
which each step refills (`InputBatch.prepare` with the graph's batch size); padding rows write their K/V
nowhere (slot -1) and attend over one token, so they cost almost nothing.
"""

from __future__ import annotations

import bisect

import torch
from tqdm import tqdm

from engine.attention.backend import AttentionMetadata
from engine.input_batch import StepBuffers
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
        buffers: StepBuffers,
        max_num_seqs: int,
        max_model_len: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def batch_size_for(self, num_reqs: int) -> int:
        """The smallest captured batch size holding `num_reqs` rows."""
        return self.sizes[bisect.bisect_left(self.sizes, num_reqs)]

    def _metadata(self, bs: int) -> AttentionMetadata:
        b = self.buffers
        return AttentionMetadata(
            query_start_loc=b.query_start_loc[: bs + 1],
            seq_lens=b.seq_lens[:bs],
            block_table=b.block_table[:bs],
            slot_mapping=b.slot_mapping[:bs],
            max_query_len=1,
            # NOTE: a bound, not the batch's value: the captured kernels must serve any context length.
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=[1] * bs,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        b = self.buffers
        return self.model(b.input_ids[:bs], b.positions[:bs], self.kv_caches, self._metadata(bs))

    @torch.inference_mode()
    def capture(self, show_progress: bool = True) -> None:
        b = self.buffers
        max_bs = self.max_batch_size
        # NOTE: captured on padding rows (one token of block 0, K/V written nowhere): the capture touches no KV.
        b.input_ids[:max_bs].zero_()
        b.positions[:max_bs].zero_()
        b.slot_mapping[:max_bs].fill_(-1)
        b.seq_lens[:max_bs].fill_(1)
        b.block_table[:max_bs].zero_()
        b.query_start_loc[: max_bs + 1].copy_(torch.arange(max_bs + 1, dtype=torch.int32))
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

    def replay(self, bs: int) -> torch.Tensor:
        """Hidden states [bs, hidden] of the batch the input buffers hold (padded to a captured size `bs`)."""
        self.graphs[bs].replay()
        return self.outputs[bs]
