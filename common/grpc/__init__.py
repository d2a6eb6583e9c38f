"""The gRPC boundary every pdserve server shares: standard services, interceptors, tolerant request parsing."""
