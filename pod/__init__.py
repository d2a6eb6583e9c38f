"""What both pod roles (prefill and decode) stand on: the process runtime (server, health, registry heartbeat,
drain), the worker protocol and load report, the pod config, the shared protobuf conversion, and `run_pod`."""
