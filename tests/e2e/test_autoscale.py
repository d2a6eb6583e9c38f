"""The autoscaler over real processes.

- `pdserve up --autoscale`: a prefill-heavy load (long uncached prompts, one output token) takes prefill from 1
  pod to 2 while decode stays at 1; once the load stops (a trickle of one request at a time goes on), the less
  loaded prefill pod drains and exits 0, and prefill is back at 1; no request fails.
- `pdserve autoscale --connector kubernetes`: publishes the target count of an overloaded role on /metrics, and
  exits 0 on SIGTERM.

With AUTOSCALE_TIMELINE_CSV=PATH the scale-out/in runs append their timeline to PATH, one row per registry read
every TIMELINE_INTERVAL_S (the test's name, seconds since the autoscaler started, active and draining pods per role,
and the load the planner sees); scripts/plot_autoscale.py draws it (docs/deploy-autoscale.svg).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.config import AutoscalerConfig
from autoscaler.run import start_for_cluster
from cli.cluster import LocalCluster
from cli.ports import free_port
from cli.redis_server import RedisServer
from client.generation_client import GenerationClient
from common.child_process import popen_child
from common.pod_registry import PodInfo, PodRegistry, PodRole
from tests.e2e.support import cluster_config, run, token_prefix, wait_until

CONCURRENCY = 8
PREFILL_HEAVY = AutoscalerConfig(
    min_prefill=1,
    max_prefill=2,
    min_decode=1,
    max_decode=2,
    autoscale_interval_s=0.3,
    scale_down_window_s=2.0,
    action_timeout_s=90.0,
    prefill_waiting_high=2.0,
    prefill_waiting_low=0.5,
)
DECODE_HEAVY = dataclasses.replace(
    PREFILL_HEAVY, prefill_waiting_high=100.0, decode_requests_high=3.0, decode_requests_low=1.5
)
DECISIONS = "pdserve:autoscaler_scaling_decisions_total"
TIMELINE_COLUMNS = ("run", "t_s", "prefill_pods", "decode_pods", "draining_pods", "prefill_waiting", "decode_requests")
TIMELINE_INTERVAL_S = 0.5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """1 prefill pod and 1 decode pod of at most 2 running requests each (more wait), and the router."""
    config = cluster_config(tmp_path, "--max-num-seqs", "2")
    with LocalCluster(config) as running:
        yield running


def active(cluster: LocalCluster, role: PodRole) -> list[str]:
    return [p.pod_id for p in cluster.pod_infos() if p.role == role and not p.draining]


class Load:
    """`concurrency` threads, each sending one uncached prompt of `prompt_tokens` tokens (`max_tokens` each) after
    the other until `stop`."""

    def __init__(
        self, client: GenerationClient, concurrency: int, prompt_tokens: int, max_tokens: int, first_seed: int = 0
    ) -> None:
        self._client = client
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sizes = (concurrency, prompt_tokens, max_tokens)
        self.completed = 0
        self.failures: list[BaseException] = []
        self._threads = [threading.Thread(target=self._loop, args=(first_seed + i,)) for i in range(concurrency)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _loop(self, seed: int) -> None:
        concurrency, prompt_tokens, max_tokens = self._sizes
        while not self._stop.is_set():
            # NOTE: a fresh seed per request: prompts share no prefix, so every one is a full prefill.
            prompt = token_prefix(seed)[:prompt_tokens]
            seed += concurrency
            try:
                run(self._client, token_ids=prompt, max_tokens=max_tokens, temperature=0.0)
            except Exception as exc:
                with self._lock:
                    self.failures.append(exc)
                return
            with self._lock:
                self.completed += 1


@contextlib.contextmanager
def timeline(cluster: LocalCluster, run_name: str) -> Iterator[None]:
    """With AUTOSCALE_TIMELINE_CSV set: append the cluster's pods and load every TIMELINE_INTERVAL_S to it."""
    path = os.environ.get("AUTOSCALE_TIMELINE_CSV")
    if not path:
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        with open(path, "a", newline="") as out:
            writer = csv.writer(out)
            if out.tell() == 0:
                writer.writerow(TIMELINE_COLUMNS)
            while not stop.wait(TIMELINE_INTERVAL_S):
                pods = cluster.pod_infos()
                live = [p for p in pods if not p.draining]
                writer.writerow(
                    [
                        run_name,
                        f"{time.monotonic() - started:.2f}",
                        sum(p.role == "prefill" for p in live),
                        sum(p.role == "decode" for p in live),
                        sum(p.draining for p in pods),
                        sum(p.num_waiting for p in pods if p.role == "prefill"),
                        sum(p.num_running + p.num_waiting for p in pods if p.role == "decode"),
                    ]
                )

    sampler = threading.Thread(target=sample, name="autoscale-timeline")
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()


def status_pods(cluster: LocalCluster, role: PodRole) -> list[tuple[str, str]]:
    """(pod_id, state) of `role`'s pods as `pdserve status --json` prints them."""
    printed = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--redis-url", cluster.redis_url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pods = json.loads(printed.stdout)["pods"]
    return sorted((pod["pod_id"], pod["state"]) for pod in pods if pod["role"] == role)


def scale_out_then_in(
    cluster: LocalCluster, config: AutoscalerConfig, role: PodRole, sizes: tuple[int, int], steady_s: float
) -> None:
    """Under CONCURRENCY requests of `sizes` (prompt tokens, max tokens), `role` goes from 1 pod to 2 and stays at
    2 for `steady_s` more; then, under a trickle of one request at a time, its less loaded pod drains and exits 0.
    The other role stays at 1 throughout; no request fails; each count changed exactly once each way; the scale-out
    shows in `pdserve status --json`."""
    other: PodRole = "decode" if role == "prefill" else "prefill"
    with timeline(cluster, f"{role}-heavy"):
        autoscaler, _ = start_for_cluster(config, cluster)
        drained: dict[str, int] = {}

        def back_to_one() -> bool:
            drained.update(cluster.reap_drained())
            return len([p for p in cluster.pod_infos() if p.role == role]) == 1 and bool(drained)

        try:
            with GenerationClient(cluster.router_address) as client:
                load = Load(client, CONCURRENCY, *sizes)
                try:
                    scaled_out = wait_until(lambda: len(active(cluster, role)) == 2, 60.0, interval_s=0.2)
                    assert active(cluster, other) == [f"{other}-0"]
                    assert status_pods(cluster, role) == [(f"{role}-0", "serving"), (f"{role}-1", "serving")]
                    steady = not wait_until(lambda: len(active(cluster, role)) != 2, steady_s, interval_s=0.2)
                finally:
                    load.stop()
                assert scaled_out, cluster.pod_infos()
                trickle = Load(client, 1, *sizes, first_seed=10_000)
                try:
                    scaled_in = wait_until(back_to_one, 30.0, interval_s=0.2)
                finally:
                    trickle.stop()
        finally:
            autoscaler.stop_thread()
    assert load.failures == [] and trickle.failures == []
    assert load.completed > 0 and trickle.completed > 0
    assert steady and scaled_in, cluster.pod_infos()
    assert list(drained.values()) == [0]
    assert sorted([*drained, *active(cluster, role)]) == [f"{role}-0", f"{role}-1"]
    assert active(cluster, other) == [f"{other}-0"]
    counts = {
        (r, d): autoscaler.registry.get_sample_value(DECISIONS, {"role": r, "direction": d})
        for r in ("prefill", "decode")
        for d in ("up", "down")
    }
    assert counts == {(role, "up"): 1, (role, "down"): 1, (other, "up"): None, (other, "down"): None}


def test_prefill_load_adds_a_prefill_pod_then_one_drains_once_the_load_stops(cluster: LocalCluster) -> None:
    scale_out_then_in(cluster, PREFILL_HEAVY, "prefill", sizes=(384, 1), steady_s=0.0)


# NOTE: a soak case (~35 s on 2 cores with its pods): the prefill scale-out and -in stays in the default suite.
@pytest.mark.soak
def test_decode_load_adds_a_decode_pod_that_stays_while_the_load_lasts_then_one_drains(cluster: LocalCluster) -> None:
    scale_out_then_in(cluster, DECODE_HEAVY, "decode", sizes=(16, 48), steady_s=5.0)


def register(redis_url: str, *pods: PodInfo) -> None:
    async def go() -> None:
        registry = PodRegistry(redis_url, ttl_s=120.0)
        try:
            for info in pods:
                await registry.register(info)
        finally:
            await registry.aclose()

    asyncio.run(go())


def targets(metrics_url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=1.0) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.labels["role"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pdserve:autoscaler_target_replicas"
    }


def test_pdserve_autoscale_kubernetes_publishes_the_target_count_and_exits_on_sigterm() -> None:
    with RedisServer() as redis:
        register(
            redis.url,
            PodInfo("prefill-a", "prefill", "10.0.0.1:50051", "m", 1, num_waiting=9),
            PodInfo("decode-a", "decode", "10.0.0.2:50051", "m", 1, num_free_blocks=100, num_total_blocks=100),
        )
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "cli.main",
            "autoscale",
            "--redis-url",
            redis.url,
            "--connector",
            "kubernetes",
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            "--autoscale-interval-s",
            "0.2",
            "--prefill-waiting-high",
            "4",
        ]
        process = popen_child(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            assert wait_until(lambda: targets(url) == {"prefill": 2.0}, 20.0, interval_s=0.1), targets(url)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                output, _ = process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        assert process.returncode == 0, output
        assert "autoscaler: prefill up 1 -> 2: waiting requests per pod 9.00 > high 4" in output


# NOTE: a soak case (~60 s on 2 cores with its three pods).
@pytest.mark.soak
def test_on_a_fixed_set_of_gpus_a_decode_load_takes_the_gpu_of_an_idle_prefill_pod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """3 GPU ids (pods on a CPU host ignore them) and one pod per GPU: 2 prefill + 1 decode. Under a decode-heavy
    load the less loaded prefill pod drains and exits, and decode-1 starts on its GPU once it is gone; no request
    fails."""
    config = cluster_config(tmp_path, "--max-num-seqs", "2", num_prefill=2, gpus=("0", "1", "2"))
    budget = dataclasses.replace(DECODE_HEAVY, max_total_pods=3, scale_down_window_s=60.0)
    caplog.set_level("INFO", logger="cli.cluster")
    with LocalCluster(config) as cluster:
        autoscaler, _ = start_for_cluster(budget, cluster)
        drained: dict[str, int] = {}
        try:
            with GenerationClient(cluster.router_address) as client:
                load = Load(client, CONCURRENCY, 16, 48)
                try:
                    moved = wait_until(lambda: len(active(cluster, "decode")) == 2, 120.0, interval_s=0.2)
                    cluster.reap_drained()
                    # NOTE: the GPU wait of decode-1's start reaped the drained pod already.
                    drained.update(cluster.drained_exits)
                finally:
                    load.stop()
        finally:
            autoscaler.stop_thread()
        assert moved, cluster.pod_infos()
        kept = active(cluster, "prefill")
    assert load.failures == [] and load.completed > 0
    assert len(kept) == 1 and list(drained.values()) == [0] and {*kept, *drained} == {"prefill-0", "prefill-1"}
    started = [m for m in caplog.messages if m.startswith("started ") and "CUDA_VISIBLE_DEVICES" in m]
    gpus = {m.split()[1]: m.split("CUDA_VISIBLE_DEVICES=")[1].split(")")[0] for m in started}
    assert {pod: gpus[pod] for pod in ("prefill-0", "prefill-1", "decode-0")} == {
        "prefill-0": "0,1,2",
        "prefill-1": "1,2,0",
        "decode-0": "2,0,1",
    }
    assert gpus["decode-1"] == gpus[next(iter(drained))]
