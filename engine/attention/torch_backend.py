"""Reference attention on torch ops: correct on any device for any mix of chunks and decodes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend, AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    """Gathers each request's context from its block table and runs SDPA on it (one request at a time)."""

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        num_q_heads, num_kv_heads = query.shape[1], kv_cache.shape[3]
        group = num_q_heads // num_kv_heads
        output = torch.empty_like(query)
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            q = query[starts[i] : starts[i + 1]]
            q_len = q.shape[0]
            num_blocks = -(-seq_len // self.block_size)
            blocks = kv_cache[metadata.block_table[i, :num_blocks]]  # [n, 2, bs, Hkv, D]
            k = blocks[:, 0].flatten(0, 1)[:seq_len]
            v = blocks[:, 1].flatten(0, 1)[:seq_len]
            if group > 1:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
            # [H, L, D] layout for SDPA; queries are the last q_len positions of the context.
            context_len = seq_len - q_len
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1),
                k.transpose(0, 1),
                v.transpose(0, 1),
                attn_mask=_chunk_mask(q_len, seq_len, query.device) if context_len and q_len > 1 else None,
                is_causal=context_len == 0 and q_len > 1,
                scale=self.scale,
            )
            output[starts[i] : starts[i + 1]] = out.transpose(0, 1)
        return output


def _chunk_mask(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """Causal mask of a chunk whose queries sit after `seq_len - q_len` cached tokens."""
    context_len = seq_len - q_len
    q_pos = torch.arange(context_len, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
    return k_pos <= q_pos
