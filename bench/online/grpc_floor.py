"""The CPU floor of gRPC Python (grpc.aio) under the router's traffic, with none of the router's own work.

Three processes: an upstream server whose Generate streams `--messages` responses (one token each, as a decode pod
does for a request of that many tokens, plus the last), a relay whose Generate reads that stream from the upstream
and writes each message on to its caller (the router's two hops, and nothing else: no tokenizing, routing, Redis
or detokenizing), and this process, the client, running `--calls` calls at each concurrency. Reported: the CPU
seconds per call of the relay, and of the upstream alone when the client calls it directly (a server that only
writes its stream: the cost of the router's client-facing hop by itself).

python3 -m bench.online.grpc_floor [--messages 33] [--calls 1000] [--concurrency 32 128]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import time
from collections.abc import AsyncIterator, Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import grpc
import grpc.aio

from pdserve.v1 import generation_pb2, generation_pb2_grpc

SERVICE = generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name
Generate = Callable[[generation_pb2.GenerateRequest, Any], AsyncIterator[generation_pb2.GenerateResponse]]


def _upstream(num_messages: int) -> Generate:
    async def generate(request: generation_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        for token_id in range(num_messages):
            yield generation_pb2.GenerateResponse(request_id=request.request_id, token_ids=[token_id], text="x")

    return generate


def _relay(upstream: generation_pb2_grpc.GenerationServiceAsyncStub) -> Generate:
    async def generate(request: generation_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        async for response in upstream.Generate(request):
            yield generation_pb2.GenerateResponse(
                request_id=response.request_id, token_ids=response.token_ids, text=response.text
            )

    return generate


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _server_process(
    upstream_port: int | None, num_messages: int, replies: Queue[Any], marks: Queue[Any], stop: Event
) -> None:
    """Serves (the relay when `upstream_port` is given, else the upstream), puts its port on `replies`, then its
    CPU seconds so far each time something arrives on `marks`, until `stop`."""

    async def main() -> None:
        server = grpc.aio.server()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{upstream_port}") if upstream_port else None
        generate = _relay(generation_pb2_grpc.GenerationServiceStub(channel)) if channel else _upstream(num_messages)
        handler = grpc.unary_stream_rpc_method_handler(
            generate,
            request_deserializer=generation_pb2.GenerateRequest.FromString,
            response_serializer=generation_pb2.GenerateResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Generate": handler}),))
        replies.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            if await loop.run_in_executor(None, marks.get) is not None:
                replies.put(_cpu_s())
        await server.stop(None)

    asyncio.run(main())


async def _run_calls(port: int, concurrency: int, num_calls: int, num_messages: int) -> float:
    """Seconds for `num_calls` Generate calls, `concurrency` at a time, each read to its end."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        await channel.channel_ready()
        slots = asyncio.Semaphore(concurrency)

        async def call(index: int) -> None:
            async with slots:
                received = [r async for r in stub.Generate(generation_pb2.GenerateRequest(request_id=str(index)))]
                if len(received) != num_messages:
                    raise RuntimeError(f"call {index}: {len(received)} messages, expected {num_messages}")

        started = time.monotonic()
        await asyncio.gather(*(call(i) for i in range(num_calls)))
        return time.monotonic() - started


class _Server:
    """One server process and the queues that ask it for its CPU seconds."""

    def __init__(self, context: Any, stop: Event, num_messages: int, upstream_port: int | None = None) -> None:
        self._replies: Queue[Any] = context.Queue()
        self._marks: Queue[Any] = context.Queue()
        self.process = context.Process(
            target=_server_process, args=(upstream_port, num_messages, self._replies, self._marks, stop)
        )
        self.process.start()
        self.port: int = self._replies.get()

    def cpu_s(self) -> float:
        self._marks.put(True)
        return float(self._replies.get())

    def stop(self) -> None:
        self._marks.put(None)
        self.process.join(10)


def measure(num_messages: int, num_calls: int, concurrencies: list[int]) -> list[str]:
    """One line per (server, concurrency): CPU milliseconds per call and calls per second."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    upstream = _Server(context, stop, num_messages)
    relay = _Server(context, stop, num_messages, upstream.port)
    lines = []
    try:
        for concurrency in concurrencies:
            for name, server in (("relay (two hops)", relay), ("upstream alone (one hop)", upstream)):
                asyncio.run(_run_calls(server.port, concurrency, num_calls // 5, num_messages))  # warm-up
                before = server.cpu_s()
                wall_s = asyncio.run(_run_calls(server.port, concurrency, num_calls, num_messages))
                per_call_ms = 1e3 * (server.cpu_s() - before) / num_calls
                lines.append(
                    f"{name}, concurrency {concurrency}: {per_call_ms:.2f} ms CPU per call of "
                    f"{num_messages} messages, {num_calls / wall_s:.0f} calls/s"
                )
    finally:
        stop.set()
        relay.stop()
        upstream.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=33, help="messages per call (32 tokens and the last)")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    args = parser.parse_args()
    for line in measure(args.messages, args.calls, args.concurrency):
        print(line, flush=True)


if __name__ == "__main__":
    main()
