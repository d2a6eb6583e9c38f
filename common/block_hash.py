"""Chained block hashes: the one function router, engines and the Redis directory share.

`hash_i = H(hash_{i-1}, token_ids of full block i, extra_keys)` over FULL blocks only.
H is BLAKE2b with a 16-byte digest: stable across processes, machines and Python versions
(never Python's `hash()`), and fast enough for thousands of blocks per request.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

_DIGEST_SIZE = 16
# NOTE: the chain's root; changing it invalidates every cached prefix in every directory.
ROOT_HASH: BlockHash = hashlib.blake2b(b"pdserve/block-hash/v1", digest_size=_DIGEST_SIZE).digest()


def _encode_extra_keys(extra_keys: Sequence[str]) -> bytes:
    parts = [struct.pack("<I", len(extra_keys))]
    for key in extra_keys:
        raw = key.encode()
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def hash_block_tokens(
    parent_hash: BlockHash | None, token_ids: Sequence[int], extra_keys: Sequence[str] = ()
) -> BlockHash:
    """Hash one full block, chained on its parent's hash (None for the first block)."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    h.update(ROOT_HASH if parent_hash is None else parent_hash)
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(_encode_extra_keys(extra_keys))
    return h.digest()


def hash_prompt_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str] = (),
    parent_hash: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, in order; a trailing partial block has none."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_block_tokens(parent_hash, token_ids[start : start + block_size], extra_keys)
        hashes.append(parent_hash)
    return hashes


def block_extra_keys(model_id: str, cache_salt: str | None = None) -> tuple[str, ...]:
    """Extra keys mixed into every block hash: the model, and an optional per-tenant salt."""
    return (model_id,) if cache_salt is None else (model_id, cache_salt)
