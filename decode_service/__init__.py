"""gRPC service running the engine in the decode role."""
