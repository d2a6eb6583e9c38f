"""A tiny synchronous client of the public `pdserve.v1.GenerationService`.

    from client import generate

    for response in generate("localhost:50051", "The capital of France is", max_tokens=8, temperature=0):
        print(response.text, end="", flush=True)

Sampling keyword arguments are the fields of `pdserve.v1.SamplingParams` (max_tokens, temperature,
top_p, top_k, seed, stop, ...). Leaving the loop early cancels the request on the server. A router with
auth and TLS on: `GenerationClient(address, token="...", security=client_security(ca="ca.pem"))`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from common.auth import bearer_metadata
from common.grpc.server import message_size_options, reconnect_options
from common.tls import ChannelSecurity
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2

_SAMPLING_FIELDS = sampling_pb2.SamplingParams.DESCRIPTOR.fields_by_name


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, str]] | None = None,
    token_ids: Sequence[int] | None = None,
    request_id: str | None = None,
    cache_salt: str | None = None,
    **sampling: Any,
) -> generation_pb2.GenerateRequest:
    """A GenerateRequest for exactly one of `prompt` (text), `messages` ({"role", "content"} dicts) or
    `token_ids`; unknown sampling keywords raise TypeError."""
    if sum(x is not None for x in (prompt, messages, token_ids)) != 1:
        raise TypeError("pass exactly one of prompt, messages or token_ids")
    unknown = sorted(set(sampling) - set(_SAMPLING_FIELDS))
    if unknown:
        raise TypeError(f"unknown sampling parameters {unknown}; known: {sorted(_SAMPLING_FIELDS)}")
    params = sampling_pb2.SamplingParams()
    for name, value in sampling.items():
        if _SAMPLING_FIELDS[name].is_repeated:
            getattr(params, name).extend([value] if isinstance(value, str) else value)
        else:
            setattr(params, name, value)
    request = generation_pb2.GenerateRequest(sampling_params=params)
    if prompt is not None:
        request.text = prompt
    elif messages is not None:
        request.messages.messages.extend(
            generation_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages
        )
    else:
        request.token_ids.token_ids.extend(token_ids or ())
    if request_id is not None:
        request.request_id = request_id
    if cache_salt is not None:
        request.cache_salt = cache_salt
    return request


class GenerationClient:
    """One channel to a pdserve router (plain text, or TLS with `security`); every call presents `token` as its
    bearer token when given. `generate` may be called from many threads at once."""

    def __init__(self, address: str, token: str | None = None, security: ChannelSecurity | None = None) -> None:
        self._metadata = bearer_metadata(token)
        # NOTE: a restarted router is redialled within a second, not after gRPC's backoff of up to 120 s.
        options = [*message_size_options(), *reconnect_options(max_backoff_s=1.0)]
        self._channel = (security or ChannelSecurity()).channel(address, options)
        self._stub = generation_pb2_grpc.GenerationServiceStub(self._channel)

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        timeout_s: float | None = None,
        **sampling: Any,
    ) -> Generator[generation_pb2.GenerateResponse, None, None]:
        """Stream the responses of one Generate call (see `build_request` for the arguments).

        Raises `grpc.RpcError` on a failed call; closing the iterator early cancels the call.
        """
        request = build_request(
            prompt, messages=messages, token_ids=token_ids, request_id=request_id, cache_salt=cache_salt, **sampling
        )
        call = self._stub.Generate(request, timeout=timeout_s, metadata=self._metadata or None)
        try:
            yield from call
        finally:
            call.cancel()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GenerationClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def generate(
    address: str,
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, str]] | None = None,
    token_ids: Sequence[int] | None = None,
    timeout_s: float | None = None,
    token: str | None = None,
    security: ChannelSecurity | None = None,
    **kwargs: Any,
) -> Iterator[generation_pb2.GenerateResponse]:
    """One Generate call on a channel of its own: `GenerationClient(address, token, security).generate(...)`, then
    close."""
    with GenerationClient(address, token, security) as client:
        yield from client.generate(prompt, messages=messages, token_ids=token_ids, timeout_s=timeout_s, **kwargs)
