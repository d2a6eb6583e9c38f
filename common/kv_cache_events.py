"""Events a block pool emits as its prefix cache changes, drained by the pod's directory publisher.

Consumers apply them in order: a `BlockStored` batch is one chain of consecutive blocks (each block's
parent is the previous hash in the batch, the first one's is `parent_block_hash`), a `BlockRemoved`
lists hashes that are no longer cached, and `AllBlocksCleared` drops everything known of the pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.block_hash import BlockHash


@dataclass(slots=True, frozen=True)
class BlockStored:
    """Blocks newly cached, in chain order; `parent_block_hash` is None for a prompt's first block."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    """Blocks evicted from the cache."""

    block_hashes: tuple[BlockHash, ...]


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
