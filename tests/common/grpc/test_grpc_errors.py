"""Errors over a real grpc.aio server on a local port: the ErrorInterceptor's status codes and rich details."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from common.errors import InvalidArgumentError, PdserveError, ResourceExhaustedError, UnavailableError
from common.grpc.errors import bad_request_fields, retry_delay_s, to_status
from common.grpc.server import HealthState
from kv_transfer.state import LayoutMismatchError, TransferExpiredError, UnknownTransferError
from pdserve.v1 import generation_pb2
from tests.common.grpc.grpc_server_support import run_served


def _rich_status(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    (value,) = [v for k, v in error.trailing_metadata() or () if k == "grpc-status-details-bin"]
    assert isinstance(value, bytes)
    return status_pb2.Status.FromString(value)


def test_invalid_argument_names_the_public_field_after_streamed_messages() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        request = generation_pb2.GenerateRequest(request_id="r1")
        request.sampling_params.temperature = -1.0
        call = stub.Generate(request)
        assert (await call.read()).text == "first"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == "sampling_params.temperature: must be finite and >= 0, got -1.0"
        violation = ("sampling_params.temperature", "must be finite and >= 0, got -1.0")
        assert bad_request_fields(raised.value) == [violation]

    run_served(test)


def test_engine_prompt_maps_to_text() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="prompt"))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(raised.value) == [("text", "too long")]

    run_served(test)


def test_resource_exhausted_carries_retry_info() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.GetModelInfo(generation_pb2.GetModelInfoRequest())
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raised.value.details() == "no free KV blocks"
        (detail,) = _rich_status(raised.value).details
        retry_info = error_details_pb2.RetryInfo()
        assert detail.Unpack(retry_info)
        assert retry_info.retry_delay.ToNanoseconds() == 1_000_000_000
        assert bad_request_fields(raised.value) == []

    run_served(test)


def test_an_errors_own_retry_after_is_its_retry_info_in_milliseconds() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as overloaded:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="overloaded"))
        assert (overloaded.value.code(), overloaded.value.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "overloaded: 3 requests waiting",
        )
        assert retry_delay_s(overloaded.value) == 0.25
        with pytest.raises(grpc.aio.AioRpcError) as unplaceable:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unplaceable"))
        assert unplaceable.value.code() == grpc.StatusCode.UNAVAILABLE
        assert retry_delay_s(unplaceable.value) == 1.5
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unavailable"))
        assert retry_delay_s(plain.value) is None

    run_served(test)


def test_unavailable_abort_and_downstream_status() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        outcomes = []
        for text in ("unavailable", "abort", "downstream"):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Tokenize(generation_pb2.TokenizeRequest(text=text))
            outcomes.append((raised.value.code(), raised.value.details()))
        assert outcomes == [
            (grpc.StatusCode.UNAVAILABLE, "no decode pod"),
            (grpc.StatusCode.NOT_FOUND, "no such thing"),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "no free KV blocks"),
        ]

    run_served(test)


def test_unexpected_error_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="other"))
        assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INTERNAL, "internal error")

    with caplog.at_level(logging.ERROR, logger="common.grpc.errors"):
        run_served(test)
    (record,) = caplog.records
    assert record.getMessage() == "unhandled RuntimeError in a gRPC handler"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "boom"


def test_pdserve_errors_report_the_status_their_class_names() -> None:
    cases = [
        (TransferExpiredError("KV transfer 't' ended expired").for_request("r"), grpc.StatusCode.ABORTED),
        (LayoutMismatchError("KV layouts differ in dtype"), grpc.StatusCode.FAILED_PRECONDITION),
        (UnknownTransferError("no transfer 'u'"), grpc.StatusCode.NOT_FOUND),
    ]
    for error, code in cases:
        assert (to_status(error).code, to_status(error).details) == (code, str(error))
    assert str(cases[0][0]) == "request 'r': KV transfer 't' ended expired"
    assert type(cases[0][0]) is TransferExpiredError
    # NOTE: a plain PdserveError names no status of its own: INTERNAL, its message kept out of the reply.
    assert (to_status(PdserveError("secret")).code, to_status(PdserveError("secret")).details) == (
        grpc.StatusCode.INTERNAL,
        "internal error",
    )


def test_to_status_keeps_unknown_and_dotted_fields() -> None:
    for field in ("cache_salt", "sampling_params.top_p"):
        status = to_status(InvalidArgumentError(field, "bad"))
        assert (status.code, status.details) == (grpc.StatusCode.INVALID_ARGUMENT, f"{field}: bad")
    status = to_status(InvalidArgumentError("stop", "bad"), field_paths={})
    assert status.details == "stop: bad"
    assert to_status(UnavailableError()).details == "no healthy pod"
    rich = status_pb2.Status.FromString(
        dict(to_status(ResourceExhaustedError(), retry_delay_s=0.25).trailing_metadata)["grpc-status-details-bin"]
    )
    retry_info = error_details_pb2.RetryInfo()
    assert rich.code == code_pb2.RESOURCE_EXHAUSTED
    assert rich.details[0].Unpack(retry_info)
    assert retry_info.retry_delay.ToNanoseconds() == 250_000_000


def test_unavailable_carries_retry_info_only_when_it_names_a_delay() -> None:
    bare = status_pb2.Status.FromString(
        dict(to_status(UnavailableError("no pod", retry_after_s=0.75)).trailing_metadata)["grpc-status-details-bin"]
    )
    retry_info = error_details_pb2.RetryInfo()
    assert (bare.code, bare.message) == (code_pb2.UNAVAILABLE, "no pod")
    assert bare.details[0].Unpack(retry_info)
    assert retry_info.retry_delay.ToNanoseconds() == 750_000_000
    plain = status_pb2.Status.FromString(
        dict(to_status(UnavailableError("no pod")).trailing_metadata)["grpc-status-details-bin"]
    )
    assert (plain.code, plain.message, len(plain.details)) == (code_pb2.UNAVAILABLE, "no pod", 0)


def test_retry_delay_is_read_back_from_a_call_error() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as exhausted:
            await stub.GetModelInfo(generation_pb2.GetModelInfoRequest())
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unavailable"))
        assert (retry_delay_s(exhausted.value), retry_delay_s(unavailable.value)) == (1.0, None)

    run_served(test)
