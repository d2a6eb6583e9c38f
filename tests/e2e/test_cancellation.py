"""Acceptance 5: cancelling a stream frees its KV blocks on the decode pod and on the prefill pod within
2 s plus one heartbeat (as the registry shows them), and a reservation nobody claims lapses with its lease."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from cli.client import GenerationClient, build_request
from cli.cluster import LocalCluster
from common.pod_registry import PodInfo
from pdserve.v1 import decode_pb2, decode_pb2_grpc, generation_pb2_grpc
from tests.e2e.support import HEARTBEAT_S, num_blocks, wait_until

CANCEL_BOUND_S = 2.0 + HEARTBEAT_S
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
