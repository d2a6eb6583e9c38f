"""The autoscaler of `pdserve up --autoscale` over real processes: a prefill-heavy load (long uncached prompts,
one output token) takes prefill from 1 pod to 2 while decode stays at 1; once the load stops, the added pod
drains and prefill is back at 1; no request fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.autoscaler.commands import start_for_cluster
from cli.autoscaler.config import AutoscalerConfig
from cli.client import GenerationClient
from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from common.pod_registry import PodRole
from tests.e2e.support import POD_ARGS, REGISTRY_REFRESH_S, STARTUP_TIMEOUT_S, run, token_prefix, wait_until

CONCURRENCY = 8
PROMPT_TOKENS = 384
AUTOSCALER = AutoscalerConfig(
    min_prefill=1, max_prefill=2, min_decode=1, max_decode=2, autoscale_interval_s=0.3, scale_down_window_s=2.0,
    action_timeout_s=90.0, prefill_waiting_high=2.0, prefill_waiting_low=0.5,
)  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """1 prefill pod and 1 decode pod of at most 2 running requests each (more wait), and the router."""
    config = ClusterConfig(
        num_prefill=1, num_decode=1, port=0, registry_refresh_s=REGISTRY_REFRESH_S,
        pod_args=(*POD_ARGS, "--max-num-seqs", "2"), log_dir=tmp_path, startup_timeout_s=STARTUP_TIMEOUT_S,
        metrics_port=None,
    )  # fmt: skip
    with LocalCluster(config) as running:
        yield running


def active(cluster: LocalCluster, role: PodRole) -> list[str]:
    return [p.pod_id for p in cluster.pod_infos() if p.role == role and not p.draining]


class PrefillLoad:
    """CONCURRENCY threads, each sending one long uncached prompt after the other until `stop`."""

    def __init__(self, client: GenerationClient) -> None:
        self._client = client
        self._stop = threading.Event()
        self.completed = 0
        self.failures: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(CONCURRENCY)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _loop(self, worker: int) -> None:
        seed = worker
        while not self._stop.is_set():
            # NOTE: a fresh seed per request: prompts share no prefix, so every one is a full prefill.
            prompt = token_prefix(seed)[:PROMPT_TOKENS]
            seed += CONCURRENCY
            try:
                run(self._client, token_ids=prompt, max_tokens=1, temperature=0.0)
            except Exception as exc:
                with self._lock:
                    self.failures.append(exc)
                return
            with self._lock:
                self.completed += 1


def test_prefill_load_adds_a_prefill_pod_then_it_drains_once_the_load_stops(cluster: LocalCluster) -> None:
    autoscaler, _ = start_for_cluster(AUTOSCALER, cluster)
    try:
        with GenerationClient(cluster.router_address) as client:
            load = PrefillLoad(client)
            load.start()
            try:
                scaled_out = wait_until(lambda: len(active(cluster, "prefill")) == 2, 60.0, interval_s=0.2)
                assert active(cluster, "decode") == ["decode-0"]
            finally:
                load.stop()
        assert scaled_out, cluster.pod_infos()
        assert load.failures == [] and load.completed > 0
        drained: dict[str, int] = {}

        def back_to_one() -> bool:
            drained.update(cluster.reap_drained())
            return [p.pod_id for p in cluster.pod_infos() if p.role == "prefill"] == ["prefill-0"] and bool(drained)

        assert wait_until(back_to_one, 30.0, interval_s=0.2), cluster.pod_infos()
        assert drained == {"prefill-1": 0}
        assert active(cluster, "decode") == ["decode-0"]
        decisions = "pdserve:autoscaler_scaling_decisions_total"
        ups = autoscaler.registry.get_sample_value(decisions, {"role": "decode", "direction": "up"})
        assert ups is None, "decode never scales"
    finally:
        autoscaler.stop_thread()
