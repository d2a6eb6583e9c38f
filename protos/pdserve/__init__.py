"""pdserve protobuf and gRPC contracts (generated code lives in pdserve.v1)."""
