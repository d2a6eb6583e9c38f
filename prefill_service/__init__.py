"""gRPC service running the engine in the prefill role."""
