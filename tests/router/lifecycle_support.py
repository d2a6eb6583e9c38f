"""Helpers of the router's Generate tests over scripted pods: a token-id request and reading a call to its end."""

from __future__ import annotations

import grpc.aio

from pdserve.v1 import generation_pb2, sampling_pb2

TEXT = " The quick brown fox jumps over the lazy dog, then naps under a tall green tree until dusk"
PROMPT = list(range(1000, 1040))  # 2 full blocks and 8 tokens


def generate_request(max_tokens: int = 16, **params: object) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(token_ids=PROMPT),
        request_id="req-1",
        sampling_params=sampling_pb2.SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
    )


async def collect(call: object) -> list[generation_pb2.GenerateResponse]:
    """Every remaining response of a Generate call (read with `read`, so it may follow earlier reads)."""
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
        responses.append(response)
    return responses
