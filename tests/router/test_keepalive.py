"""The router's pod channel options (router.pods.pod_client.KEEPALIVE_OPTIONS) against a real server process that is
stopped with SIGSTOP: a call in flight fails with UNAVAILABLE within seconds, not when a lease or TTL lapses."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.pods.pod_client import KEEPALIVE_OPTIONS

pytestmark = pytest.mark.anyio

# NOTE: the pods' server options (pod.runtime), so the test also shows that they accept the pings.
_SERVER = """
import asyncio
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc

async def main():
    server = grpc.aio.server(options=[("grpc.http2.min_ping_interval_without_data_ms", 500),
                                      ("grpc.keepalive_permit_without_calls", 1)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


async def test_a_stopped_pod_fails_the_call_in_flight_within_seconds() -> None:
    process = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=KEEPALIVE_OPTIONS) as channel:
            call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            first = await call.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            # NOTE: idle for 3 pings first: a live server answers them (no GOAWAY for too many pings).
            await asyncio.sleep(3.0)
            process.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await asyncio.wait_for(call.read(), 10.0)
            elapsed = time.monotonic() - stopped_at
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        assert elapsed < 4.0
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
