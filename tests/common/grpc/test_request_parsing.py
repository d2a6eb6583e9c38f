"""Request messages that do not parse: INVALID_ARGUMENT naming the bad field, no handler call, no traceback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from common.grpc.errors import ErrorInterceptor, bad_request_fields
from common.grpc.request_parsing import UnparsedRequest, tolerant_deserializer
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2

BAD_UTF8 = b"\xff\xfe"


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (payload < 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


CASES = [
    pytest.param(_field(1, BAD_UTF8), "text", id="text"),
    pytest.param(_field(5, b"id") + _field(6, BAD_UTF8), "cache_salt", id="cache-salt"),
    pytest.param(
        _field(2, _field(1, _field(1, b"user") + _field(2, BAD_UTF8))), "messages.messages.content", id="chat"
    ),
    pytest.param(_field(4, _field(11, BAD_UTF8)), "sampling_params.stop", id="stop"),
    pytest.param(b"\xff\xff\xff", "request", id="garbage"),
    pytest.param(_field(1, b"abc")[:-1], "text", id="truncated"),
]


@pytest.mark.parametrize(("data", "field"), CASES)
def test_bytes_that_do_not_parse_name_the_field(data: bytes, field: str) -> None:
    parse = tolerant_deserializer(generation_pb2.GenerateRequest.FromString)
    assert parse is not None
    unparsed = parse(data)
    assert isinstance(unparsed, UnparsedRequest)
    assert unparsed.error.field == field
    assert unparsed.error.description.startswith("request message does not parse: Error parsing message")


def test_bytes_that_parse_are_the_message() -> None:
    parse = tolerant_deserializer(generation_pb2.GenerateRequest.FromString)
    assert parse is not None
    request = generation_pb2.GenerateRequest(text="hi", sampling_params=sampling_pb2.SamplingParams(stop=["é"]))
    assert parse(request.SerializeToString()) == request


class _Recording(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[generation_pb2.GenerateResponse]:
        self.calls.append(request)
        yield generation_pb2.GenerateResponse(request_id="ok")

    async def GetModelInfo(self, request: Any, context: Any) -> generation_pb2.GetModelInfoResponse:
        self.calls.append(request)
        return generation_pb2.GetModelInfoResponse(model_id="m")


@pytest.mark.anyio
async def test_the_interceptor_answers_invalid_argument_without_calling_the_handler_or_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = _Recording()
    # NOTE: the field paths map engine names; a field of the request message itself must not be mapped.
    server = grpc.aio.server(interceptors=[ErrorInterceptor({"text": "engine.prompt"})])
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    caplog.set_level(logging.WARNING)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            generate = channel.unary_stream("/pdserve.v1.GenerationService/Generate")
            info = channel.unary_unary("/pdserve.v1.GenerationService/GetModelInfo")
            errors = []
            for call in (lambda: generate(_field(1, BAD_UTF8)).read(), lambda: info(b"\x0f")):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await call()
                errors.append(raised.value)
            good = await generate(generation_pb2.GenerateRequest(text="hi").SerializeToString()).read()
    finally:
        await server.stop(None)
    assert [e.code() for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert [[field for field, _ in bad_request_fields(e)] for e in errors] == [["text"], ["request"]]
    assert (errors[0].details() or "").startswith("text: request message does not parse")
    assert servicer.calls == [generation_pb2.GenerateRequest(text="hi")]
    assert good == b"\n\x02ok"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
