"""Acceptance 5: cancelling a stream frees its KV blocks on the decode pod and on the prefill pod within
2 s plus one heartbeat (as the registry shows them), and a reservation nobody claims lapses with its lease.
An Abort of a stream's request_id (on another channel) ends the stream with CANCELLED at once and frees the KV the
same way, mid-decode and mid-prefill."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient, build_request
from common.pod_registry import PodInfo
from pdserve.v1 import decode_pb2, decode_pb2_grpc, generation_pb2, generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S, REQUEST_TIMEOUT_S, num_blocks, wait_until

CANCEL_BOUND_S = 2.0 + HEARTBEAT_S
ABORT_END_BOUND_S = 2.0
"""From sending Abort to the aborted stream's status at its client (measured: a few milliseconds)."""
LEASE_S = 1.0
STORY = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "


def idle(pods: list[PodInfo]) -> bool:
    return all(p.num_free_blocks == p.num_total_blocks and p.num_running == 0 and p.num_waiting == 0 for p in pods)


def holding(role: str) -> Callable[[LocalCluster], bool]:
    """Whether some pod of `role` holds a request's blocks right now (as its last heartbeat said)."""
    return lambda cluster: any(
        p.role == role and p.num_free_blocks < p.num_total_blocks and p.num_running > 0 for p in cluster.pod_infos()
    )


def test_cancelling_mid_decode_frees_the_blocks_everywhere(cluster: LocalCluster, client: GenerationClient) -> None:
    assert wait_until(lambda: idle(cluster.pod_infos()), 5.0), cluster.pod_infos()
    stream = client.generate(prompt=STORY * 2, max_tokens=400, ignore_eos=True, temperature=0.0)
    first_messages = [next(stream) for _ in range(3)]
    assert sum(len(m.token_ids) for m in first_messages) >= 3
    assert wait_until(lambda: holding("decode")(cluster), 2.0), cluster.pod_infos()
    stream.close()
    cancelled_at = time.monotonic()
    assert wait_until(lambda: idle(cluster.pod_infos()), CANCEL_BOUND_S), cluster.pod_infos()
    assert time.monotonic() - cancelled_at <= CANCEL_BOUND_S


def test_cancelling_mid_prefill_frees_the_blocks_everywhere(cluster: LocalCluster) -> None:
    assert wait_until(lambda: idle(cluster.pod_infos()), 5.0), cluster.pod_infos()
    with grpc.insecure_channel(cluster.router_address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        call = stub.Generate(build_request(STORY * 60, max_tokens=4, temperature=0.0), timeout=120)
        prefilling = wait_until(lambda: holding("prefill")(cluster), 30.0)
        cancelled = call.cancel()
    cancelled_at = time.monotonic()
    assert prefilling and cancelled, "the prompt's prefill was not seen running before it finished"
    assert wait_until(lambda: idle(cluster.pod_infos()), CANCEL_BOUND_S), cluster.pod_infos()
    assert time.monotonic() - cancelled_at <= CANCEL_BOUND_S


def _ended_at(call: grpc.Call) -> tuple[grpc.StatusCode, str, float]:
    """Reads a Generate call to its end: its status code, details, and time.monotonic() when the status came."""
    try:
        for _ in call:  # type: ignore[attr-defined]
            pass
    except grpc.RpcError as error:
        return error.code(), error.details(), time.monotonic()  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, "", time.monotonic()


def _abort(cluster: LocalCluster, call: grpc.Call, request_id: str) -> None:
    """Aborts `request_id` on a channel of its own; its stream must end with CANCELLED within ABORT_END_BOUND_S
    (read on a thread, so that a stream that does not end fails the test instead of hanging it)."""
    with grpc.insecure_channel(cluster.router_address) as channel, ThreadPoolExecutor(1) as reader:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        sent_at = time.monotonic()
        answer = stub.Abort(generation_pb2.AbortRequest(request_id=request_id), timeout=5)
        assert (answer.result, answer.num_aborted) == (generation_pb2.ABORT_RESULT_ABORTED, 1)
        ending = reader.submit(_ended_at, call)
        try:
            code, details, ended_at = ending.result(timeout=ABORT_END_BOUND_S)
        except TimeoutError:
            pytest.fail(f"the aborted stream got no status within {ABORT_END_BOUND_S} s")
        finally:
            call.cancel()
        assert (code, details) == (grpc.StatusCode.CANCELLED, f"request {request_id!r} was aborted")
        assert ended_at - sent_at <= ABORT_END_BOUND_S
        again = stub.Abort(generation_pb2.AbortRequest(request_id=request_id), timeout=5)
        assert again.result == generation_pb2.ABORT_RESULT_ALREADY_FINISHED


def test_abort_mid_decode_ends_the_stream_cancelled_and_frees_the_blocks_everywhere(cluster: LocalCluster) -> None:
    assert wait_until(lambda: idle(cluster.pod_infos()), 5.0), cluster.pod_infos()
    request_id = f"abort-{uuid.uuid4().hex}"
    request = build_request(STORY * 2, request_id=request_id, max_tokens=400, ignore_eos=True, temperature=0.0)
    with grpc.insecure_channel(cluster.router_address) as channel:
        call = generation_pb2_grpc.GenerationServiceStub(channel).Generate(request, timeout=REQUEST_TIMEOUT_S)
        num_tokens = 0
        for response in call:
            num_tokens += len(response.token_ids)
            if num_tokens >= 30:
                break
        assert wait_until(lambda: holding("decode")(cluster), 2.0), cluster.pod_infos()
        _abort(cluster, call, request_id)
    aborted_at = time.monotonic()
    assert wait_until(lambda: idle(cluster.pod_infos()), CANCEL_BOUND_S), cluster.pod_infos()
    assert time.monotonic() - aborted_at <= CANCEL_BOUND_S


def test_abort_mid_prefill_ends_the_stream_cancelled_and_frees_the_blocks_everywhere(cluster: LocalCluster) -> None:
    assert wait_until(lambda: idle(cluster.pod_infos()), 5.0), cluster.pod_infos()
    request_id = f"abort-{uuid.uuid4().hex}"
    with grpc.insecure_channel(cluster.router_address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        request = build_request(STORY * 60, request_id=request_id, max_tokens=4, temperature=0.0)
        call = stub.Generate(request, timeout=REQUEST_TIMEOUT_S)
        assert wait_until(lambda: holding("prefill")(cluster), 30.0), "the prompt's prefill was not seen running"
        _abort(cluster, call, request_id)
    aborted_at = time.monotonic()
    assert wait_until(lambda: idle(cluster.pod_infos()), CANCEL_BOUND_S), cluster.pod_infos()
    assert time.monotonic() - aborted_at <= CANCEL_BOUND_S


def test_an_unclaimed_reservation_lapses_with_its_lease(cluster: LocalCluster) -> None:
    pod_id = cluster.add_pod("decode", ["--kv-lease-s", str(LEASE_S)])
    try:
        [info] = [p for p in cluster.pod_infos() if p.pod_id == pod_id]

        def free_blocks() -> int:
            return next(p.num_free_blocks for p in cluster.pod_infos() if p.pod_id == pod_id)

        with grpc.insecure_channel(info.address) as channel:
            reserve = decode_pb2_grpc.DecodeServiceStub(channel).Reserve
            # NOTE: taken before the call: the lease starts at the pod, after the request was sent
            sent_at = time.monotonic()
            reply = reserve(decode_pb2.ReserveRequest(request_id="never-claimed", num_prompt_tokens=100, max_tokens=4))
        assert reply.lease.ToMilliseconds() == LEASE_S * 1000
        assert len(reply.kv_target.block_ids) == num_blocks(100)
        assert wait_until(lambda: free_blocks() == info.num_total_blocks - num_blocks(100), LEASE_S / 2)
        assert wait_until(lambda: free_blocks() == info.num_total_blocks, 2 * LEASE_S + HEARTBEAT_S)
        assert time.monotonic() - sent_at >= LEASE_S
    finally:
        assert cluster.stop_pod(pod_id).returncode == 0
