"""A router of two processes (`--workers 2`) on one port in front of a real prefill and decode pod and Redis: streams
from connections on either worker complete and /metrics counts both; an Abort ends a stream whichever worker holds
it and whichever the Abort reaches; admission's limits are the whole router's (one call in flight to the prefill
pods, a client's streams, whichever worker holds them); a killed worker is restarted; SIGTERM drains both and ends
every process."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.cluster import LocalCluster
from cli.ports import free_port
from client.generation_client import build_request
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from tests.e2e.support import channels_to_each_worker, cluster_config, wait_until

pytestmark = pytest.mark.slow

NUM_WORKERS = 2
STORY = "Once upon a time a robot learned to paint the sea, and every evening it painted one more wave. "
ABORT_BOUND_S = 1.0
RESTART_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0
MAX_STREAMS_PER_CLIENT = 4
"""The router's per-client limit here (above the 2 or 3 streams the other tests' one client holds at once)."""
ROUTER_ARGS = ("--max-waiting-requests-per-prefill-pod", "1", "--max-streams-per-client", str(MAX_STREAMS_PER_CLIENT))
"""One call in flight to the prefill pods at a time, whichever worker holds it."""
LONG_PROMPT = [100 + i % 1000 for i in range(1024)]
"""A prompt the prefill pod takes 16 chunked steps over (POD_ARGS: 64-token chunks)."""


@pytest.fixture(scope="module")
def workers_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = cluster_config(
        tmp_path_factory.mktemp("workers-logs"),
        http_port=free_port(),
        router_workers=NUM_WORKERS,
        router_args=ROUTER_ARGS,
        metrics_port=0,
    )
    with LocalCluster(config) as cluster:
        yield cluster


@pytest.fixture
def channels(workers_cluster: LocalCluster) -> Iterator[dict[int, grpc.Channel]]:
    """A channel to each worker (by index), each its own connection."""
    found = channels_to_each_worker(workers_cluster.router_address, NUM_WORKERS)
    assert sorted(found) == list(range(NUM_WORKERS))
    yield found
    for channel in found.values():
        channel.close()


def _stub(channel: grpc.Channel) -> generation_pb2_grpc.GenerationServiceStub:
    return generation_pb2_grpc.GenerationServiceStub(channel)


def _finished_requests(url: str) -> float:
    """The router's request_success counter summed over its finish reasons, as /metrics at `url` says."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pdserve:request_success_total" and sample.labels.get("role") == "router"
    )


def _workers(cluster: LocalCluster) -> list[int]:
    """The pids of the router's workers (its supervisor's children)."""
    assert cluster.router is not None
    pid = cluster.router.pid
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _each_worker_answers(address: str) -> bool:
    channels = channels_to_each_worker(address, NUM_WORKERS, timeout_s=5.0)
    for channel in channels.values():
        channel.close()
    return sorted(channels) == list(range(NUM_WORKERS))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_streams_on_both_workers_complete_and_metrics_count_them_all(
    workers_cluster: LocalCluster, channels: dict[int, grpc.Channel]
) -> None:
    metrics_url = workers_cluster.metrics_urls["router"]
    http_metrics_url = f"{workers_cluster.http_url}/metrics"
    before = _finished_requests(metrics_url)
    for worker, channel in channels.items():
        for i in range(2):
            request = build_request(f"Worker {worker}, story {i}: {STORY}", max_tokens=4, temperature=0.0)
            responses = list(_stub(channel).Generate(request, timeout=120))
            assert sum(len(r.token_ids) for r in responses) == 4
    assert _finished_requests(metrics_url) - before == 2 * NUM_WORKERS
    assert _finished_requests(http_metrics_url) == _finished_requests(metrics_url)


def _running_stream(
    channel: grpc.Channel, request_id: str, timeout_s: float
) -> Iterator[generation_pb2.GenerateResponse]:
    """A long Generate stream on `channel`, its first message read (so it runs in that channel's worker)."""
    request = build_request(STORY * 2, max_tokens=400, ignore_eos=True, temperature=0.0, request_id=request_id)
    stream = _stub(channel).Generate(request, timeout=timeout_s)
    assert next(stream).request_id == request_id
    return stream


def _num_running(channel: grpc.Channel) -> int:
    return _stub(channel).GetLoad(generation_pb2.GetLoadRequest(), timeout=10).num_running_requests


@pytest.mark.parametrize(("holder", "caller"), [(0, 1), (1, 0), (0, 0)])
def test_abort_cancels_the_request_whichever_worker_holds_it_and_whichever_it_reaches(
    channels: dict[int, grpc.Channel], holder: int, caller: int
) -> None:
    request_id = f"abort-{holder}-{caller}"
    stream = _running_stream(channels[holder], request_id, timeout_s=120)
    try:
        load = _stub(channels[caller]).GetLoad(generation_pb2.GetLoadRequest(), timeout=10)
        assert (load.router_worker, load.num_running_requests) == (caller, 1), "the whole router's count"
        aborted_at = time.monotonic()
        answer = _stub(channels[caller]).Abort(generation_pb2.AbortRequest(request_id=request_id), timeout=10)
        assert (answer.result, answer.num_aborted) == (generation_pb2.ABORT_RESULT_ABORTED, 1)
        assert wait_until(lambda: _num_running(channels[caller]) == 0, ABORT_BOUND_S)
        assert time.monotonic() - aborted_at <= ABORT_BOUND_S
        again = _stub(channels[1 - caller]).Abort(generation_pb2.AbortRequest(request_id=request_id), timeout=10)
        assert (again.result, again.num_aborted) == (generation_pb2.ABORT_RESULT_ALREADY_FINISHED, 0)
    finally:
        stream.cancel()


def test_an_aborted_stream_ends_cancelled_within_a_second(channels: dict[int, grpc.Channel]) -> None:
    stream = _running_stream(channels[0], "abort-ends-stream", timeout_s=10)
    aborted_at = time.monotonic()
    _stub(channels[1]).Abort(generation_pb2.AbortRequest(request_id="abort-ends-stream"), timeout=10)
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    assert ended.value.code() is grpc.StatusCode.CANCELLED, ended.value
    assert time.monotonic() - aborted_at <= ABORT_BOUND_S


def _prefill_busy(url: str) -> bool:
    """Whether the prefill pod's engine holds a request (running or waiting), as its /metrics at `url` says."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return any(
        sample.value > 0
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in ("pdserve:num_requests_running", "pdserve:num_requests_waiting")
    )


def _first_message_at(stream: Iterator[generation_pb2.GenerateResponse]) -> float:
    next(stream)
    return time.monotonic()


def _no_call_left(channel: grpc.Channel) -> None:
    assert wait_until(lambda: _num_running(channel) == 0, RESTART_TIMEOUT_S), "the test's calls still run"


def test_a_call_in_flight_in_one_worker_holds_a_call_in_the_other_in_the_queue(
    workers_cluster: LocalCluster, channels: dict[int, grpc.Channel]
) -> None:
    prefill_url = workers_cluster.metrics_urls["prefill-0"]
    assert wait_until(lambda: not _prefill_busy(prefill_url), RESTART_TIMEOUT_S)
    # NOTE: a salt of its own, so that the long prompt is prefilled anew (no cached prefix) whenever the test runs.
    request = build_request(token_ids=LONG_PROMPT, max_tokens=1, temperature=0.0, cache_salt=uuid.uuid4().hex)
    long_stream = _stub(channels[0]).Generate(request, timeout=120)
    assert wait_until(lambda: _prefill_busy(prefill_url), RESTART_TIMEOUT_S, interval_s=0.01)
    # the long call is in flight in worker 0: the short one on worker 1 waits for its first token (with a limit per
    # worker, it would be prefilled beside the long prompt's next chunk and answered first)
    short_stream = _stub(channels[1]).Generate(build_request(STORY, max_tokens=1, temperature=0.0), timeout=120)
    with ThreadPoolExecutor(1) as pool:
        short_first = pool.submit(_first_message_at, short_stream)
        long_first_at = _first_message_at(long_stream)
        assert long_first_at < short_first.result()
    _no_call_left(channels[0])


def test_a_clients_streams_count_against_its_limit_in_every_worker(channels: dict[int, grpc.Channel]) -> None:
    metadata = (("x-client-id", "shared-client"),)
    streams = []
    try:
        for worker in (0, 0, 1, 1):
            request = build_request(STORY, max_tokens=400, ignore_eos=True, temperature=0.0)
            streams.append(_stub(channels[worker]).Generate(request, timeout=120, metadata=metadata))
            next(streams[-1])
        for channel in channels.values():
            with pytest.raises(grpc.RpcError) as refused:
                next(_stub(channel).Generate(build_request(STORY, max_tokens=1), timeout=30, metadata=metadata))
            assert (refused.value.code(), refused.value.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"overloaded: client 'shared-client' has {MAX_STREAMS_PER_CLIENT} streams open "
                f"(limit {MAX_STREAMS_PER_CLIENT})",
            )
    finally:
        for stream in streams:
            stream.cancel()
    _no_call_left(channels[0])


def test_a_killed_worker_is_restarted_and_the_counts_of_both_are_kept(workers_cluster: LocalCluster) -> None:
    metrics_url = workers_cluster.metrics_urls["router"]
    with grpc.insecure_channel(workers_cluster.router_address) as channel:
        list(_stub(channel).Generate(build_request(STORY, max_tokens=2, temperature=0.0), timeout=120))
    finished = _finished_requests(metrics_url)
    workers = _workers(workers_cluster)
    os.kill(workers[0], signal.SIGKILL)
    assert wait_until(lambda: len(set(_workers(workers_cluster)) - set(workers)) == 1, RESTART_TIMEOUT_S)
    assert wait_until(lambda: _each_worker_answers(workers_cluster.router_address), RESTART_TIMEOUT_S)
    assert _finished_requests(metrics_url) == finished, "the killed worker's counts still count"
    assert workers_cluster.router is not None and workers_cluster.router.returncode is None


def test_sigterm_drains_both_workers_and_ends_every_process(
    workers_cluster: LocalCluster, channels: dict[int, grpc.Channel]
) -> None:
    router = workers_cluster.router
    assert router is not None
    workers = _workers(workers_cluster)
    run_dir = Path(Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")[3].decode())
    request = build_request(STORY, max_tokens=24, ignore_eos=True, temperature=0.0)
    streams = [_stub(channel).Generate(request, timeout=120) for channel in channels.values()]
    firsts = [next(stream) for stream in streams]
    router.send_signal(signal.SIGTERM)
    num_tokens = [
        len(first.token_ids) + sum(len(r.token_ids) for r in stream)
        for first, stream in zip(firsts, streams, strict=True)
    ]
    assert num_tokens == [24] * NUM_WORKERS
    assert router.wait_or_kill(EXIT_TIMEOUT_S) == 0
    assert not any(_alive(pid) for pid in workers)
    assert not run_dir.exists()
    workers_cluster.restart_router()
