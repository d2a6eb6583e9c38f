"""A stand-in for the router and the pods in LocalCluster's own tests: it takes their flags, serves only
grpc.health.v1 (SERVING after `--load-s`), registers pods in Redis and heartbeats, and on SIGTERM
deregisters and exits 0. `--exit-code N` exits with N right away instead (a process that fails to start).

    python standin_service.py --role decode [--load-s 0.2] [--exit-code N] <the role's flags>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

import grpc.aio

from common.grpc.server import add_standard_services
from common.pod_registry import PodInfo, PodRegistry


async def serve(args: argparse.Namespace) -> int:
    server = grpc.aio.server()
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    health = add_standard_services(server, [])
    await server.start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), args.load_s)
    registry = PodRegistry(args.redis_url) if args.role != "router" else None
    if registry is not None:
        info = PodInfo(args.pod_id, args.role, f"{args.host}:{port}", args.model, time.time_ns())
        registry.start_heartbeat(lambda: info, interval_s=0.2)
    if not stopping.is_set():
        await health.set_serving()
        print(f"pdserve {args.role} serving on {args.host}:{port}", flush=True)
    await stopping.wait()
    if registry is not None:
        await registry.stop_heartbeat()
        await registry.deregister(args.pod_id)
        await registry.aclose()
    await server.stop(grace=None)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", required=True)
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--pod-id", default="")
    parser.add_argument("--model", default="")
    args, _ = parser.parse_known_args()
    if args.exit_code is not None:
        print(f"stand-in {args.role} failing on purpose", file=sys.stderr)
        return int(args.exit_code)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
