"""Builds an engine's KV cache manager and, with `swap_space`, its host tier (swapper and prefix tier)."""

from __future__ import annotations

from common.block_hash import block_extra_keys
from common.errors import InvalidArgumentError
from engine.config import EngineConfig
from engine.executor import Executor
from engine.kv_cache_manager import KVCacheManager
from engine.kv_tier.copier import HostKVCopier
from engine.kv_tier.host_block_pool import HostBlockPool
from engine.kv_tier.swapper import KVSwapper
from engine.kv_tier.tiered_kv_cache_manager import TieredKVCacheManager


def make_kv_cache(config: EngineConfig, executor: Executor) -> tuple[KVCacheManager, KVSwapper | None]:
    """The cache manager over the executor's pool, and the swapper of preempted requests (None without a host
    tier). With `host_prefix_cache` (and prefix caching on) the manager also keeps evicted blocks in the host tier."""
    cache = config.cache
    extra_keys = block_extra_keys(config.model.model, cache.cache_salt)
    if cache.swap_space == 0:
        return KVCacheManager(executor.num_blocks, cache.block_size, cache.enable_prefix_caching, extra_keys), None
    (device_pool,) = executor.kv_pools
    num_slots = HostKVCopier.num_slots(device_pool, cache.swap_space)
    if num_slots == 0:
        raise InvalidArgumentError("swap_space", f"{cache.swap_space} GiB holds no KV block")
    copier = HostKVCopier(device_pool, num_slots)
    host = HostBlockPool(num_slots)
    kv: KVCacheManager
    if cache.host_prefix_cache and cache.enable_prefix_caching:
        kv = TieredKVCacheManager(executor.num_blocks, cache.block_size, host, copier, extra_keys)
    else:
        kv = KVCacheManager(executor.num_blocks, cache.block_size, cache.enable_prefix_caching, extra_keys)
    return kv, KVSwapper(kv, host, copier, cache.swap_min_tokens)
