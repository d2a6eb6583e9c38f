"""A cancel storm of 100 streams on 1 prefill + 2 decode pods (real processes): streams cancelled at random points
(before their first message, mid-prefill, mid-decode) leave KV on every pod at its baseline within 2 s and no error
in any log (no "Failed to detach context"), and (soak) the throughput afterwards is within 10% of before."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cli.cluster import LocalCluster
from client.generation_client import build_request
from pdserve.v1 import generation_pb2_grpc
from tests.faults.overload_support import KV_BOUND_S, PROMPT, closed_loop
from tests.faults.support import fault_cluster, kv_at_baseline, log_errors, seconds_until


def cancel_storm(address: str, num_streams: int, seed: int) -> None:
    """`num_streams` calls at once, each cancelled after 0-20 messages (0: 0-300 ms after it started, while it is
    reserving or prefilling); returns when every call was cancelled."""
    rng = random.Random(seed)
    plans = [(rng.randint(0, 20), rng.uniform(0.0, 0.3)) for _ in range(num_streams)]
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)

        def one(num_messages: int, delay_s: float) -> None:
            prompt = PROMPT * (1 + num_messages % 4)
            call = stub.Generate(build_request(prompt, max_tokens=200, ignore_eos=True, temperature=0.0), timeout=300)
            try:
                if num_messages == 0:
                    time.sleep(delay_s)
                for _ in range(num_messages):
                    next(call)
            except (grpc.RpcError, StopIteration):
                pass
            call.cancel()

        threads = [threading.Thread(target=one, args=plan) for plan in plans]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """1 prefill + 2 decode pods: the shape where, before the fixes, a few reservations per storm waited 20 s for
    their lease (a Reserve or Decode call cancelled on its way)."""
    with fault_cluster(tmp_path_factory.mktemp("cancel-logs"), num_decode=2) as local_cluster:
        yield local_cluster


@pytest.mark.slow
def test_kv_is_back_to_baseline_within_2_s_of_a_cancel_storm(cluster: LocalCluster) -> None:
    assert seconds_until(lambda: kv_at_baseline(cluster), 10.0) is not None
    cancel_storm(cluster.router_address, 100, seed=0)
    back_s = seconds_until(lambda: kv_at_baseline(cluster), KV_BOUND_S)
    assert back_s is not None, cluster.pod_infos()
    assert log_errors(cluster, ("Failed to detach context", "Traceback")) == {}


@pytest.mark.soak
def test_100_cancelled_streams_kv_baseline_within_2_s_and_throughput_kept(tmp_path: Path) -> None:
    """The acceptance shape: 100 streams cancelled at random points; throughput (8 clients, 16 tokens each, 15 s)
    before and after. NOTE: compared per CPU second of the cluster's processes: wall-clock throughput on a shared
    2-core machine swings by half with the other load on it (both are printed)."""
    with fault_cluster(tmp_path, num_decode=2) as cluster:
        closed_loop(cluster, 8, max_tokens=16, duration_s=5.0)  # warm-up
        before = closed_loop(cluster, 8, max_tokens=16, duration_s=15.0)
        assert seconds_until(lambda: kv_at_baseline(cluster), 10.0) is not None
        cancel_storm(cluster.router_address, 100, seed=1)
        back_s = seconds_until(lambda: kv_at_baseline(cluster), 30.0)
        after = closed_loop(cluster, 8, max_tokens=16, duration_s=15.0)
        print(
            f"KV back to baseline {back_s} s after the last cancel; throughput {before.goodput:.1f} -> "
            f"{after.goodput:.1f} tokens/s, {before.tokens_per_cpu_s:.2f} -> {after.tokens_per_cpu_s:.2f} tokens "
            "per CPU second"
        )
        assert back_s is not None and back_s <= KV_BOUND_S, back_s
        assert abs(after.tokens_per_cpu_s - before.tokens_per_cpu_s) <= 0.1 * before.tokens_per_cpu_s
