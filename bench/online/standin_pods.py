"""Stand-in pods for measuring the router's CPU without GPUs: a prefill or a decode pod that speaks the pods' gRPC
protocol, registers in Redis and heartbeats like one, and computes nothing.

- Prefill answers its first token (the last prompt token + 1) at once, then TransferDone.
- Reserve answers a KV target at once; Release answers at once.
- DecodeStream runs an engine-like step clock (`--step-ms`): each step sends one message carrying one token for every
  request of that stream still running, and the end of each request that reached its max_tokens (counting the
  prefill's first token), as a decode pod sends one message per engine step. DecodeCancel ends a request.

    python -m bench.online.standin_pods --role decode --redis-url URL --model M [--step-ms 4] [--pod-id decode-0]

It prints "pdserve <role> serving on HOST:PORT" once registered, and exits on SIGTERM or SIGINT (deregistering).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from google.protobuf import duration_pb2

from common.grpc.server import add_standard_services
from common.pod_registry import PodInfo, PodRegistry
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2, prefill_pb2, prefill_pb2_grpc, sampling_pb2

Context = grpc.aio.ServicerContext[Any, Any]
BLOCK_SIZE = 16
NUM_BLOCKS = 1 << 20
_LAYOUT = kv_transfer_pb2.KVLayout(
    dtype="bfloat16", block_size=BLOCK_SIZE, num_layers=1, num_kv_heads=1, head_dim=8, block_nbytes=512
)


class StandinPrefill(prefill_pb2_grpc.PrefillServiceServicer):
    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: Context
    ) -> AsyncIterator[prefill_pb2.PrefillResponse]:
        first = prefill_pb2.FirstToken(token_id=(request.prompt_token_ids[-1] + 1) % 1000)
        yield prefill_pb2.PrefillResponse(first_token=first)
        done = prefill_pb2.TransferDone(
            num_blocks=len(request.kv_target.block_ids), num_bytes=1024, transfer_duration=duration_pb2.Duration()
        )
        yield prefill_pb2.PrefillResponse(transfer_done=done)


class StandinDecode(decode_pb2_grpc.DecodeServiceServicer):
    def __init__(self, pod_id: str, generation: int, step_s: float) -> None:
        self._pod_id = pod_id
        self._generation = generation
        self._step_s = step_s
        self._num_reserved = 0

    async def Reserve(self, request: decode_pb2.ReserveRequest, context: Context) -> decode_pb2.ReserveResponse:
        self._num_reserved += 1
        num_blocks = -(-request.num_prompt_tokens // BLOCK_SIZE)
        target = kv_transfer_pb2.KVTarget(
            transfer_id=f"{self._pod_id}-t{self._num_reserved}",
            backend=kv_transfer_pb2.TRANSFER_BACKEND_TCP,
            endpoint="127.0.0.1:1",
            block_ids=range(num_blocks),
            layout=_LAYOUT,
            generation=self._generation,
        )
        return decode_pb2.ReserveResponse(kv_target=target, lease=duration_pb2.Duration(seconds=10))

    async def Release(self, request: decode_pb2.ReleaseRequest, context: Context) -> decode_pb2.ReleaseResponse:
        return decode_pb2.ReleaseResponse()

    async def DecodeStream(
        self, request_iterator: AsyncIterator[decode_pb2.DecodeStreamRequest], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStreamResponse]:
        left: dict[int, int] = {}
        """Tokens each running request (by key) still has to produce."""
        arrived = asyncio.Event()

        async def read() -> None:
            async for frame in request_iterator:
                if frame.HasField("start"):
                    left[frame.start.key] = max(frame.start.sampling_params.max_tokens - 1, 1)
                    arrived.set()
                else:
                    left.pop(frame.cancel.key, None)

        reader = asyncio.create_task(read())
        try:
            next_step = time.monotonic()
            while not reader.done():
                if not left:
                    arrived.clear()
                    await arrived.wait()
                    next_step = time.monotonic()
                next_step += self._step_s
                await asyncio.sleep(max(next_step - time.monotonic(), 0.0))
                if left:
                    yield self._step(left)
        finally:
            reader.cancel()

    @staticmethod
    def _step(left: dict[int, int]) -> decode_pb2.DecodeStreamResponse:
        keys = list(left)
        message = decode_pb2.DecodeStreamResponse(
            keys=keys, num_tokens=[1] * len(keys), token_ids=[k % 1000 for k in keys], num_logprobs=[0] * len(keys)
        )
        for key in keys:
            left[key] -= 1
            if left[key] == 0:
                del left[key]
                message.ends.add(key=key, finish_reason=sampling_pb2.FINISH_REASON_LENGTH)
        return message


async def serve(args: argparse.Namespace) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    generation = time.time_ns()
    pod_id = args.pod_id or f"{args.role}-0"
    if args.role == "prefill":
        prefill_pb2_grpc.add_PrefillServiceServicer_to_server(StandinPrefill(), server)
        services = [prefill_pb2.DESCRIPTOR.services_by_name["PrefillService"].full_name]
    else:
        servicer = StandinDecode(pod_id, generation, args.step_ms / 1000)
        decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
        services = [decode_pb2.DESCRIPTOR.services_by_name["DecodeService"].full_name]
    health = add_standard_services(server, services)
    await server.start()
    await health.set_serving()
    address = f"{args.host}:{port}"
    info = PodInfo(pod_id, args.role, address, args.model, generation, num_free_blocks=NUM_BLOCKS)
    registry = PodRegistry(args.redis_url)
    registry.start_heartbeat(lambda: info, interval_s=0.5)
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    print(f"pdserve {args.role} serving on {address}", flush=True)
    await stopping.wait()
    await registry.stop_heartbeat()
    await registry.deregister(pod_id)
    await registry.aclose()
    await server.stop(grace=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("prefill", "decode"), required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model", required=True, help="the model the router serves (pods are listed under it)")
    parser.add_argument("--pod-id", default="")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=4.0, help="the decode step clock's period")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
