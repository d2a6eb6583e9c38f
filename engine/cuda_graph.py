"""CUDA graphs for decode batches: captured once per bucketed batch size, replayed with padding.

A decode step of a small model is hundreds of short kernels; replaying them from a graph removes the
per-kernel launch and the per-op Python cost. The graphs read the input batch's persistent device buffers,
which each step refills (`InputBatch.prepare` with the graph's batch size); padding rows write their K/V
nowhere (slot -1) and attend over one token, so they cost almost nothing.

With speculative decoding, verify steps get graphs too: (batch size, query length k + 1) for the batch sizes below
`disable_by_batch_size`, each request's tokens padded to k + 1 (padding tokens write nowhere, come after the real
ones, so the causal mask hides them from the real queries, and are never sampled).
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
        verify_query_len: int = 1,
        max_verify_batch_size: int = 0,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        self.verify_query_len = verify_query_len
        self.verify_sizes = [s for s in self.sizes if s <= max_verify_batch_size] if verify_query_len > 1 else []
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def batch_size_for(self, num_reqs: int) -> int:
        """The smallest captured batch size holding `num_reqs` rows."""
        return self.sizes[bisect.bisect_left(self.sizes, num_reqs)]

    def verify_batch_size_for(self, num_reqs: int) -> int | None:
        """The smallest captured verify batch size holding `num_reqs` requests; None above the largest."""
        index = bisect.bisect_left(self.verify_sizes, num_reqs)
        return self.verify_sizes[index] if index < len(self.verify_sizes) else None

    def _metadata(self, bs: int, query_len: int) -> AttentionMetadata:
        b = self.buffers
        return AttentionMetadata(
            query_start_loc=b.query_start_loc[: bs + 1],
            seq_lens=b.seq_lens[:bs],
            block_table=b.block_table[:bs],
            slot_mapping=b.slot_mapping[: bs * query_len],
            max_query_len=query_len,
            # NOTE: a bound, not the batch's value: the captured kernels must serve any context length.
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=list(range(0, bs * query_len + 1, query_len)),
            seq_lens_cpu=[query_len] * bs,
        )

    def _forward(self, bs: int, query_len: int) -> torch.Tensor:
        b, num_tokens = self.buffers, bs * query_len
        return self.model(
            b.input_ids[:num_tokens], b.positions[:num_tokens], self.kv_caches, self._metadata(bs, query_len)
        )

    @torch.inference_mode()
    def capture(self, show_progress: bool = True) -> None:
        shapes = [(bs, 1) for bs in reversed(self.sizes)]
        shapes += [(bs, self.verify_query_len) for bs in reversed(self.verify_sizes)]
        pool = None
        for bs, query_len in tqdm(shapes, desc="capturing CUDA graphs", unit="graph", disable=not show_progress):
            self._fill_padding(bs, query_len)
            self._forward(bs, query_len)  # warm-up: autotuning and lazy allocations happen outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs, query_len] = self._forward(bs, query_len)
            pool = graph.pool()
            self.graphs[bs, query_len] = graph
        torch.cuda.synchronize()

    def _fill_padding(self, bs: int, query_len: int) -> None:
        """Captured on padding rows (query_len tokens of block 0, K/V written nowhere): the capture touches no KV."""
        b, num_tokens = self.buffers, bs * query_len
        b.input_ids[:num_tokens].zero_()
        b.positions[:num_tokens].zero_()
        b.slot_mapping[:num_tokens].fill_(-1)
        b.seq_lens[:bs].fill_(query_len)
        b.block_table[:bs].zero_()
        b.query_start_loc[: bs + 1].copy_(torch.arange(0, num_tokens + 1, query_len, dtype=torch.int32))

    def replay(self, bs: int, query_len: int = 1) -> torch.Tensor:
        """Hidden states [bs * query_len, hidden] of the batch the input buffers hold (padded to a captured shape)."""
        self.graphs[bs, query_len].replay()
        return self.outputs[bs, query_len]
