"""Acceptance 6: bad input gets INVALID_ARGUMENT with a google.rpc.BadRequest naming the field, and the
service keeps serving."""

from __future__ import annotations

from typing import Any, cast

import grpc
import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.grpc.errors import bad_request_fields
from tests.e2e.support import Oracle, run

CASES = [
    pytest.param({"prompt": ""}, "text", id="empty-prompt"),
    pytest.param({"prompt": "Hello", "max_tokens": 1_000_000}, "sampling_params.max_tokens", id="too-long"),
    pytest.param({"prompt": "Hello", "temperature": -1.0}, "sampling_params.temperature", id="negative-temperature"),
    pytest.param({"prompt": "Hello", "top_p": 0.0}, "sampling_params.top_p", id="zero-top-p"),
]


@pytest.mark.parametrize(("request_kwargs", "field"), CASES)
def test_bad_input_names_the_field_and_the_service_keeps_serving(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle, request_kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        run(client, **request_kwargs)
    error = raised.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert [path for path, _ in bad_request_fields(cast(grpc.aio.AioRpcError, error))] == [field]
    good = run(client, prompt="The capital of France is", max_tokens=4, temperature=0.0)
    assert good.token_ids == oracle.greedy(["The capital of France is"], 4)[0].token_ids
