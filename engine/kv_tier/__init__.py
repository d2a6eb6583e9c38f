"""The host tier of KV blocks: swap on preemption, evicted prefix blocks kept in host memory, weight offload."""
