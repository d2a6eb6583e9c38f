"""The router's calls to one pod (Prefill on prefill pods; Reserve, decoding on the DecodeStream, Release on decode
pods).

Protobuf stays here: callers pass and get plain values (`router.outputs`), and a failed call raises the typed error
`router.pods.pod_errors` classifies it as. A decode pod's requests share one DecodeStream per router
(`router.pods.decode_stream`), opened with the first of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterator, Sequence

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2

from common.grpc.server import message_size_options
from common.multimodal import ImageInput
from common.proto_convert import finish_reason_from_pb, sampling_params_to_pb, stop_reason_from_pb
from common.sampling_params import SamplingParams
from common.tls import ChannelSecurity
from kv_transfer.target import KVTarget
from pdserve.v1 import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from pod.convert import kv_target_from_pb, kv_target_to_pb
from router.outputs import DecodeRequest, DecodeStep, FirstToken, TransferDone
from router.pods.decode_stream import DecodeCollector, DecodeMux
from router.pods.pod_errors import rpc_error

KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # NOTE: grpc 1.85's transport times a keepalive ping out by this one; keepalive_timeout_ms alone never fires.
    ("grpc.http2.ping_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Channel options of every router -> pod channel: a ping each second, and a pod that leaves one unanswered for 2 s
(killed without a reset, stopped, cut off) fails its calls with UNAVAILABLE at once, instead of when a lease or
the registry TTL lapses. NOTE: pods accept pings this often (`pod.runtime`'s server options)."""


@contextlib.contextmanager
def _mapped_errors(pod_id: str, rpc: str) -> Iterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise rpc_error(pod_id, rpc, exc) from exc


class PodClient:
    """One pod's channel (plain, or mutual TLS with `security`) and stubs; calls take a timeout (the client's
    remaining deadline) or None."""

    def __init__(
        self,
        pod_id: str,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        security: ChannelSecurity | None = None,
    ) -> None:
        self.pod_id = pod_id
        self.address = address
        self._channel = (security or ChannelSecurity()).aio_channel(
            address, interceptors, (*KEEPALIVE_OPTIONS, *message_size_options())
        )
        self._prefill = prefill_pb2_grpc.PrefillServiceStub(self._channel)
        self._decode = decode_pb2_grpc.DecodeServiceStub(self._channel)
        self._decode_mux: DecodeMux | None = None
        # NOTE: called by method path because the grpcio-health-checking stubs do not type HealthStub's methods.
        self._health_check = self._channel.unary_unary(
            f"/{health.SERVICE_NAME}/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )

    async def is_serving(self, timeout: float) -> bool:
        """Whether the pod answers grpc.health.v1 Check with SERVING within `timeout` (any failure: False)."""
        try:
            response = await self._health_check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    async def reserve(
        self, request_id: str, num_prompt_tokens: int, max_tokens: int, timeout: float | None
    ) -> KVTarget:
        request = decode_pb2.ReserveRequest(
            request_id=request_id, num_prompt_tokens=num_prompt_tokens, max_tokens=max_tokens
        )
        with _mapped_errors(self.pod_id, "Reserve"):
            response = await self._decode.Reserve(request, timeout=timeout)
        return kv_target_from_pb(response.kv_target, "kv_target")

    async def release(self, transfer_id: str, timeout: float | None) -> None:
        with _mapped_errors(self.pod_id, "Release"):
            await self._decode.Release(decode_pb2.ReleaseRequest(transfer_id=transfer_id), timeout=timeout)

    async def prefill(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        target: KVTarget,
        cache_salt: str | None,
        timeout: float | None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncGenerator[FirstToken | TransferDone, None]:
        """The Prefill stream: FirstToken, then TransferDone. Closing the iterator cancels the call."""
        request = prefill_pb2.PrefillRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=sampling_params_to_pb(params),
            kv_target=kv_target_to_pb(target),
            cache_salt=cache_salt,
            images=[prefill_pb2.PromptImage(data=i.data, offset=i.offset, num_tokens=i.num_tokens) for i in images],
        )
        call = self._prefill.Prefill(request, timeout=timeout)
        try:
            with _mapped_errors(self.pod_id, "Prefill"):
                async for response in call:
                    yield _prefill_event(response)
        finally:
            call.cancel()

    def start_decode(self, request: DecodeRequest) -> DecodeCollector:
        """Decode a request on this pod's DecodeStream, from the second token on; its steps come from the collector.
        End it early with `cancel_decode`."""
        mux = self._decode_mux
        if mux is None or mux.closed:
            mux = self._decode_mux = DecodeMux(self.pod_id, self._decode)
        return mux.start(request)

    def cancel_decode(self, collector: DecodeCollector) -> None:
        """End a request of `start_decode` early (the pod frees its blocks); a no-op once it ended."""
        if self._decode_mux is not None:
            self._decode_mux.cancel(collector)

    async def decode(self, request: DecodeRequest) -> AsyncGenerator[DecodeStep, None]:
        """A request's decode steps, from the second token on, up to its finish; closing the iterator cancels it."""
        collector = self.start_decode(request)
        try:
            while True:
                step = await collector.next_step()
                yield step
                if step.finish_reason is not None:
                    return
        finally:
            self.cancel_decode(collector)

    async def aclose(self) -> None:
        if self._decode_mux is not None:
            await self._decode_mux.aclose()
        await self._channel.close()


def _prefill_event(response: prefill_pb2.PrefillResponse) -> FirstToken | TransferDone:
    if response.HasField("first_token"):
        first = response.first_token
        return FirstToken(
            token_id=first.token_id,
            logprob=first.logprob if first.HasField("logprob") else None,
            num_cached_tokens=first.num_cached_tokens,
            finish_reason=finish_reason_from_pb(first.finish_reason),
            stop_reason=stop_reason_from_pb(first.stop_reason),
        )
    done = response.transfer_done
    return TransferDone(done.num_blocks, done.num_bytes, done.transfer_duration.ToNanoseconds() / 1e9)
