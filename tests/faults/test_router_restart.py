"""The router killed (SIGKILL) and restarted on its port under a steady load: clients that retry on UNAVAILABLE
get every request served, with the same greedy tokens as before the restart. The test prints its figures: the
router's restart time and the service gap the clients saw (kill to the first success after it)."""

from __future__ import annotations

import json
import signal
import threading
import time

import grpc
import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import run, wait_until
from tests.faults.input_support import PARIS, answers_paris
from tests.faults.support import kv_at_baseline

NUM_CLIENTS = 4
REQUESTS_PER_CLIENT = 10
PROMPTS = [f"Tell me one fact about the number {i}." for i in range(NUM_CLIENTS)]
RETRY_DEADLINE_S = 90.0
RETRY_INTERVAL_S = 0.1


class RetryingClient:
    """Runs greedy requests, retrying each on UNAVAILABLE until it succeeds; records what happened."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.successes: list[tuple[float, list[int]]] = []
        """(time.monotonic() at the end, token ids) of each request."""
        self.num_retries = 0
        self.errors: list[str] = []

    def run(self, prompt: str, count: int) -> None:
        with GenerationClient(self.address) as client:
            for _ in range(count):
                self._one(client, prompt)

    def _one(self, client: GenerationClient, prompt: str) -> None:
        deadline = time.monotonic() + RETRY_DEADLINE_S
        while time.monotonic() < deadline:
            try:
                completion = run(client, prompt=prompt, max_tokens=8, temperature=0.0, timeout_s=30.0)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    self.errors.append(f"{exc.code().name}: {exc.details()}")  # type: ignore[attr-defined]
                    return
                self.num_retries += 1
                time.sleep(RETRY_INTERVAL_S)
            else:
                self.successes.append((time.monotonic(), completion.token_ids))
                return
        self.errors.append(f"no success within {RETRY_DEADLINE_S} s")


@pytest.mark.slow
def test_clients_retrying_on_unavailable_are_served_after_a_router_restart(input_cluster: LocalCluster) -> None:
    with GenerationClient(input_cluster.router_address) as client:
        expected = [run(client, prompt=p, max_tokens=8, temperature=0.0).token_ids for p in PROMPTS]
    clients = [RetryingClient(input_cluster.router_address) for _ in PROMPTS]
    threads = [
        threading.Thread(target=c.run, args=(p, REQUESTS_PER_CLIENT)) for c, p in zip(clients, PROMPTS, strict=True)
    ]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: sum(len(c.successes) for c in clients) >= NUM_CLIENTS, 60.0)
    killed = time.monotonic()
    input_cluster.restart_router(signal.SIGKILL)
    serving_after_s = time.monotonic() - killed
    for thread in threads:
        thread.join(RETRY_DEADLINE_S * REQUESTS_PER_CLIENT)
    assert [c.errors for c in clients] == [[]] * NUM_CLIENTS
    assert [len(c.successes) for c in clients] == [REQUESTS_PER_CLIENT] * NUM_CLIENTS
    for c, tokens in zip(clients, expected, strict=True):
        assert [ids for _, ids in c.successes] == [tokens] * REQUESTS_PER_CLIENT
    first_after = min(t for c in clients for t, _ in c.successes if t > killed)
    figures = {
        "requests": NUM_CLIENTS * REQUESTS_PER_CLIENT,
        "failed": 0,
        "retries_on_unavailable": sum(c.num_retries for c in clients),
        "router_serving_after_s": round(serving_after_s, 1),
        "gap_kill_to_first_success_s": round(first_after - killed, 1),
    }
    assert wait_until(lambda: kv_at_baseline(input_cluster), 30.0), input_cluster.pod_infos()
    with GenerationClient(input_cluster.router_address) as client:
        assert answers_paris(client) == PARIS
    print(json.dumps(figures))
