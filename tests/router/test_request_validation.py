"""Generate end to end through the router's servicer, against scripted pods on real sockets: invalid requests are
INVALID_ARGUMENT naming the public field, before any pod is asked; a pod's own INVALID_ARGUMENT reaches the
client."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from transformers import PreTrainedTokenizerBase

from common.errors import InvalidArgumentError
from common.grpc.errors import bad_request_fields
from pdserve.v1 import generation_pb2, sampling_pb2
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool
from tests.router.fake_pods import FakeDecode, FakePrefill, decode_steps, router_over
from tests.router.lifecycle_support import collect, generate_request

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("request_fields", "field", "message"),
    [
        ({"text": ""}, "text", "must not be empty"),
        ({}, "text", "no prompt"),
        ({"messages": generation_pb2.ChatMessages()}, "messages", "at least one message"),
        ({"token_ids": generation_pb2.TokenIds()}, "token_ids", "must not be empty"),
        ({"token_ids": generation_pb2.TokenIds(token_ids=[1, 49152])}, "token_ids", "49152 at position 1"),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(max_tokens=8192)},
            "sampling_params.max_tokens",
            "prompt (1 tokens) + max_tokens (8192) = 8193 exceeds max_model_len 8192",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(temperature=-1)},
            "sampling_params.temperature",
            "must be finite and >= 0, got -1.0",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(temperature=float("inf"))},
            "sampling_params.temperature",
            "must be finite and >= 0, got inf",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(repetition_penalty=float("nan"))},
            "sampling_params.repetition_penalty",
            "must be finite and > 0, got nan",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(max_tokens=0)},
            "sampling_params.max_tokens",
            "must be >= 1",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=[""])},
            "sampling_params.stop",
            "non-empty",
        ),
        ({"text": "hi", "sampling_params": sampling_pb2.SamplingParams(n=129)}, "sampling_params.n", "<= 128"),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=["x"] * 33)},
            "sampling_params.stop",
            "at most 32 stop strings, got 33",
        ),
        (
            {"text": "hi", "sampling_params": sampling_pb2.SamplingParams(stop=["x" * 513])},
            "sampling_params.stop",
            "at most 512 characters, got one of 513",
        ),
        ({"text": "hi", "request_id": "r" * 257}, "request_id", "at most 256 characters, got 257"),
        ({"text": "hi", "request_id": "a b"}, "request_id", "printable ASCII without spaces"),
        ({"text": "hi", "request_id": "é"}, "request_id", "printable ASCII without spaces"),
        ({"text": "hi", "cache_salt": ""}, "cache_salt", "must be 1 to 256 characters when set, got 0"),
        ({"text": "hi", "cache_salt": "s" * 257}, "cache_salt", "must be 1 to 256 characters when set, got 257"),
        ({"text": "x" * (1024 * 1024 + 1)}, "text", "prompt of 1048577 bytes exceeds the limit of 1048576 bytes"),
        (
            {
                "messages": generation_pb2.ChatMessages(
                    messages=[generation_pb2.ChatMessage(role="u", content="é" * 524288)]
                )
            },
            "messages",
            "prompt of 1048577 bytes exceeds the limit of 1048576 bytes",
        ),
        (
            {"messages": generation_pb2.ChatMessages(messages=[generation_pb2.ChatMessage()] * 8193)},
            "messages",
            "at most 8192 messages (max_model_len), got 8193",
        ),
        # a prompt too long for the model names the prompt, not max_tokens
        ({"text": " hello" * 9000}, "text", "prompt of 9000 tokens leaves no room in max_model_len 8192"),
        (
            {"token_ids": generation_pb2.TokenIds(token_ids=[1] * 8192)},
            "token_ids",
            "prompt of 8192 tokens leaves no room in max_model_len 8192",
        ),
    ],
)
async def test_validation_errors_name_the_public_field(
    tokenizer_pool: TokenizerPool,
    tokenizer: PreTrainedTokenizerBase,
    model: ModelInfo,
    request_fields: dict[str, object],
    field: str,
    message: str,
) -> None:
    prefill = FakePrefill()
    decode = FakeDecode("decode-0", decode_steps([6]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generation_pb2.GenerateRequest(**request_fields)))  # type: ignore[arg-type]
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    ((reported_field, description),) = bad_request_fields(info.value)
    assert reported_field == field and message in description
    assert prefill.requests == [] and decode.reserves == []


async def test_a_pods_own_invalid_argument_reaches_the_client(
    tokenizer_pool: TokenizerPool, tokenizer: PreTrainedTokenizerBase, model: ModelInfo
) -> None:
    prefill = FakePrefill(fail=InvalidArgumentError("max_tokens", "exceeds this pod's max_model_len 512"))
    decode = FakeDecode("decode-0", decode_steps([6]))
    async with router_over({"prefill-0": prefill}, {"decode-0": decode}, tokenizer_pool, tokenizer, model) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generate_request()))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(info.value) == [("sampling_params.max_tokens", "exceeds this pod's max_model_len 512")]
    assert decode.releases == ["decode-0-t1"]
    # a decode pod's Reserve names its own top-level field; the client sees the public path
    decode.reserve_fail = InvalidArgumentError("max_tokens", "too long for this pod")
    async with router_over(
        {"prefill-0": FakePrefill()}, {"decode-0": decode}, tokenizer_pool, tokenizer, model
    ) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(router.stub.Generate(generate_request()))
    assert bad_request_fields(info.value) == [("sampling_params.max_tokens", "too long for this pod")]
