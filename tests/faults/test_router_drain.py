"""The router drained over real processes: after SIGTERM it reports DRAINING (grpc.health.v1 NOT_SERVING for the
server and its service, GetLoad DRAINING), refuses a new Generate call UNAVAILABLE with a RetryInfo, lets the stream in
flight finish, then exits 0; a new router on its port serves again."""

from __future__ import annotations

import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.grpc.errors import retry_delay_s
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.admission.admission import DRAIN_RETRY_S
from router.server import SERVICE_NAME
from tests.e2e.support import wait_until
from tests.faults.input_support import PARIS, PARIS_PROMPT, answers_paris
from tests.faults.support import Stream, join_streams

MAX_TOKENS = 128
EXIT_TIMEOUT_S = 60.0


def _health(channel: grpc.Channel, service: str) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.mark.slow
def test_a_draining_router_finishes_its_stream_refuses_new_calls_and_exits(input_cluster: LocalCluster) -> None:
    router = input_cluster.router
    assert router is not None
    request = {"prompt": PARIS_PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
    with (
        GenerationClient(input_cluster.router_address) as client,
        grpc.insecure_channel(input_cluster.router_address) as channel,
    ):
        stream = Stream(request).start(client)
        assert wait_until(lambda: len(stream.token_ids) > 0 or stream.finished.is_set(), 60.0)
        router.send_signal(signal.SIGTERM)
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert wait_until(lambda: _health(channel, "") == not_serving, 10.0)
        assert _health(channel, SERVICE_NAME) == not_serving
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        assert stub.GetLoad(generation_pb2.GetLoadRequest(), timeout=5).state == generation_pb2.SERVER_STATE_DRAINING
        with pytest.raises(grpc.RpcError) as refused:
            list(client.generate(prompt=PARIS_PROMPT, max_tokens=2, temperature=0.0, timeout_s=10.0))
        assert isinstance(refused.value, grpc.Call)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert retry_delay_s(refused.value) == DRAIN_RETRY_S
        assert not stream.finished.is_set(), "the stream ended before the drain could be watched"
        join_streams([stream])
    assert stream.error is None, stream.error
    assert len(stream.token_ids) == MAX_TOKENS
    assert router.wait_or_kill(EXIT_TIMEOUT_S) == 0
    input_cluster.restart_router()
    with GenerationClient(input_cluster.router_address) as client:
        assert answers_paris(client) == PARIS
