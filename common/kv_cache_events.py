"""Events a block pool emits as its prefix cache changes, drained by the pod's directory publisher.

Consumers apply them in order: a `BlockStored` batch is one chain of consecutive blocks (each block's
parent is the previous hash in the batch, the first one's is `parent_block_hash`), a `BlockRemoved`
lists hashes that are no longer cached, and `AllBlocksCleared` drops everything known of the pod.

Each `BlockStored` / `BlockRemoved` names its tier: `device` (the accelerator's KV pool) or `host` (the host tier
of `engine.kv_tier`, where evicted blocks wait to be copied back). A block may be in both tiers at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.block_hash import BlockHash

DEVICE_TIER = "device"
HOST_TIER = "host"


@dataclass(slots=True, frozen=True)
class BlockStored:
    """Blocks newly cached, in chain order; `parent_block_hash` is None for a prompt's first block."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    tier: str = DEVICE_TIER


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    """Blocks evicted from the cache."""

    block_hashes: tuple[BlockHash, ...]
    tier: str = DEVICE_TIER


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
