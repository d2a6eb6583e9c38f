"""W6 kv-transfer (`w6`): the KV of N prompt tokens moved between two processes over one backend (`sender` is the
spawned prefill side)."""
