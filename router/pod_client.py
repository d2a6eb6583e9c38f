"""The router's calls to one pod (Prefill on prefill pods; Reserve, Decode, Release on decode pods).

Protobuf stays here: callers pass and get plain values (`router.outputs`). Failures that the router
acts on become pdserve errors: UNAVAILABLE -> UnavailableError (the pod is gone or draining; try
another), RESOURCE_EXHAUSTED -> ResourceExhaustedError (no KV blocks there, or overloaded; its RetryInfo
kept), INVALID_ARGUMENT with a BadRequest -> InvalidArgumentError naming the same field (reported under its
public path). Any other status propagates as the grpc.aio.AioRpcError, which the router's ErrorInterceptor
passes on to its client with the pod's status and details.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterator, Sequence

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2

from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.grpc_errors import bad_request_fields, retry_delay_s
from common.grpc_server import message_size_options
from common.proto_convert import finish_reason_from_pb, sampling_params_to_pb, stop_reason_from_pb
from common.sampling_params import SamplingParams
from common.tls import ChannelSecurity
from kv_transfer.target import KVTarget
from pdserve.v1 import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from pod.convert import kv_target_from_pb, kv_target_to_pb
from router.outputs import DecodeStep, FirstToken, TransferDone

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
        code = exc.code()
        if code is grpc.StatusCode.UNAVAILABLE:
            raise UnavailableError(f"{rpc} on pod {pod_id}: {exc.details()}") from exc
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise ResourceExhaustedError(f"{rpc} on pod {pod_id}: {exc.details()}", retry_delay_s(exc)) from exc
        violations = bad_request_fields(exc) if code is grpc.StatusCode.INVALID_ARGUMENT else []
        if violations:
            # NOTE: re-raised so that the router's interceptor reports the public field path (a pod may name
            # the engine's field, e.g. Reserve's top-level max_tokens).
            raise InvalidArgumentError(*violations[0]) from exc
        raise


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
    ) -> AsyncGenerator[FirstToken | TransferDone, None]:
        """The Prefill stream: FirstToken, then TransferDone. Closing the iterator cancels the call."""
        request = prefill_pb2.PrefillRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling_params=sampling_params_to_pb(params),
            kv_target=kv_target_to_pb(target), cache_salt=cache_salt,
        )  # fmt: skip
        call = self._prefill.Prefill(request, timeout=timeout)
        try:
            with _mapped_errors(self.pod_id, "Prefill"):
                async for response in call:
                    yield _prefill_event(response)
        finally:
            call.cancel()

    async def decode(
        self,
        request_id: str,
        transfer_id: str,
        prompt_token_ids: Sequence[int],
        first_token_id: int,
        params: SamplingParams,
        cache_salt: str | None,
        timeout: float | None,
    ) -> AsyncGenerator[DecodeStep, None]:
        """The Decode stream, from the second token on. Closing the iterator cancels the call."""
        request = decode_pb2.DecodeRequest(
            request_id=request_id, transfer_id=transfer_id, prompt_token_ids=prompt_token_ids,
            first_token_id=first_token_id, sampling_params=sampling_params_to_pb(params), cache_salt=cache_salt,
        )  # fmt: skip
        call = self._decode.Decode(request, timeout=timeout)
        try:
            with _mapped_errors(self.pod_id, "Decode"):
                async for response in call:
                    yield DecodeStep(
                        tuple(response.token_ids),
                        tuple(response.logprobs),
                        finish_reason_from_pb(response.finish_reason),
                        stop_reason_from_pb(response.stop_reason),
                    )
        finally:
            call.cancel()

    async def aclose(self) -> None:
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
