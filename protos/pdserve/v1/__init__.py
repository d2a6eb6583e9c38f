"""pdserve.v1: generated protobuf messages and gRPC stubs; sources are the .proto files beside them."""
