"""Paged attention on Triton kernels: split-KV decode and varlen prefill, one launch each."""

from __future__ import annotations

import functools

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.decode_tuning import PROGRAMS_PER_SM, decode_launch
from engine.attention.triton_decode import decode_attention
from engine.attention.triton_prefill import prefill_attention

# NOTE: splitting stops once a partition would hold fewer tokens than this; each split costs a partial write.
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32


class TritonAttentionBackend(AttentionBackend):
    """Runs the decode kernel on requests with one query token and the prefill
    kernel on the others. Which launches a step needs is read off integers of the metadata (no per-request
    Python work per layer); each kernel skips the requests that the other one owns. `pdl`: the decode kernels
    launch early (engine.layers.pdl), each waiting for the kernel before it.
    """

    def __init__(self, block_size: int, scale: float, pdl: bool = False) -> None:
        super().__init__(block_size, scale)
        self.pdl = pdl

    def with_pdl(self) -> TritonAttentionBackend:
        return TritonAttentionBackend(self.block_size, self.scale, pdl=True)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        if kv_cache.shape[2] != self.block_size:
            raise ValueError(f"kv_cache block size {kv_cache.shape[2]} differs from the backend's {self.block_size}")
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        args = (query, kv_cache, metadata.query_start_loc, metadata.seq_lens, metadata.block_table, output)
        num_reqs, max_query_len = metadata.num_reqs, metadata.max_query_len
        # NOTE: every request has max_query_len > 1 tokens when they add up to num_reqs * max_query_len.
        if max_query_len == 1 or query.shape[0] != num_reqs * max_query_len:
            launch = decode_launch(str(kv_cache.dtype).removeprefix("torch."))
            num_programs, num_sms = num_reqs * kv_cache.shape[3], _num_sms(query.device)
            num_splits = num_kv_splits(num_programs, metadata.max_seq_len, num_sms, launch.programs_per_sm)
            decode_attention(*args, self.scale, num_splits, launch.tiles, pdl=self.pdl)
        if max_query_len > 1:
            prefill_attention(*args, self.scale)
        return output


def num_kv_splits(num_programs: int, max_seq_len: int, num_sms: int, programs_per_sm: int = PROGRAMS_PER_SM) -> int:
    """How many partitions each decode context is cut into so that the decode kernel fills the GPU.

    Depends only on the batch's (request, KV head) count and max_seq_len (a bound): the kernel is correct
    for any count, so a CUDA graph captured with one stays right for other context lengths.
    """
    wanted = -(-programs_per_sm * num_sms // max(num_programs, 1))
    by_length = -(-max_seq_len // MIN_SPLIT_TOKENS)
    return max(1, min(wanted, by_length, MAX_SPLITS))


@functools.cache
def _num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device; a small stand-in elsewhere (the Triton interpreter on CPU)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
