"""Redis stopped under a steady load of 40 requests, then started again (empty, on its port) while the load goes
on: 40/40 succeed with the greedy tokens of a run before, and routing by the prefix directory resumes. The
quicker restart cases and the routing checks of tests/e2e/test_redis_outage.py are reused, not repeated; this
test adds the steady load and prints its figures (outage, re-registration, directory back, KV back to idle)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import BLOCK_SIZE, run, sequential, token_prefix, wait_until, with_suffix
from tests.e2e.test_redis_outage import cached_blocks, registered_and_seen
from tests.faults.input_support import PARIS, answers_paris
from tests.faults.support import kv_at_baseline

NUM_CLIENTS = 4
REQUESTS_PER_CLIENT = 10
OUTAGE_S = 3.0
"""Five registry TTLs (3 heartbeats of 0.2 s each): the pods' entries would have lapsed many times over."""
PROMPT_TOKENS = 32
PREFIX_TOKENS = 128


class SteadyClient:
    """Greedy requests back to back, each one's outcome recorded."""

    def __init__(self, address: str, prompt: list[int]) -> None:
        self.address = address
        self.prompt = prompt
        self.outputs: list[list[int]] = []
        self.errors: list[str] = []

    def run(self, count: int) -> None:
        with GenerationClient(self.address) as client:
            for _ in range(count):
                try:
                    self.outputs.append(run(client, token_ids=self.prompt, max_tokens=2, temperature=0.0).token_ids)
                except Exception as exc:
                    self.errors.append(repr(exc))


@pytest.mark.slow
def test_forty_requests_succeed_across_a_redis_restart_and_directory_routing_resumes(
    input_cluster: LocalCluster,
) -> None:
    prompts = [token_prefix(seed=50 + i)[:PROMPT_TOKENS] for i in range(NUM_CLIENTS)]
    with GenerationClient(input_cluster.router_address) as client:
        expected = [run(client, token_ids=p, max_tokens=2, temperature=0.0).token_ids for p in prompts]
    clients = [SteadyClient(input_cluster.router_address, p) for p in prompts]
    threads = [threading.Thread(target=c.run, args=(REQUESTS_PER_CLIENT,)) for c in clients]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: sum(len(c.outputs) for c in clients) >= NUM_CLIENTS, 60.0)
    num_before = sum(len(c.outputs) for c in clients)
    input_cluster.stop_redis()
    time.sleep(OUTAGE_S)
    num_during = sum(len(c.outputs) for c in clients) - num_before
    input_cluster.start_redis()
    restarted = time.monotonic()
    assert wait_until(lambda: registered_and_seen(input_cluster), 10.0), input_cluster.pod_infos()
    registered_s = time.monotonic() - restarted
    for thread in threads:
        thread.join(300.0)
    assert [c.errors for c in clients] == [[]] * NUM_CLIENTS
    for c, tokens in zip(clients, expected, strict=True):
        assert c.outputs == [tokens] * REQUESTS_PER_CLIENT
    prefix = token_prefix(seed=60)[:PREFIX_TOKENS]
    with GenerationClient(input_cluster.router_address) as client:
        after = sequential(client, prefix, 3)
    served = [(c.metrics.prefill_pod_id, c.usage.cached_prompt_tokens) for c in after]
    assert served[1:] == [(served[0][0], PREFIX_TOKENS)] * 2, served
    live = {p.pod_id: p.generation for p in input_cluster.pod_infos() if p.role == "prefill"}
    published = wait_until(
        lambda: (
            cached_blocks(input_cluster.redis_url, with_suffix(prefix, 0), live).get(served[0][0], 0)
            >= PREFIX_TOKENS // BLOCK_SIZE
        ),
        5.0,
    )
    assert published, cached_blocks(input_cluster.redis_url, with_suffix(prefix, 0), live)
    started = time.monotonic()
    assert wait_until(lambda: kv_at_baseline(input_cluster), 30.0), input_cluster.pod_infos()
    kv_s = time.monotonic() - started
    with GenerationClient(input_cluster.router_address) as client:
        assert answers_paris(client) == PARIS
    print(
        json.dumps(
            {
                "requests": NUM_CLIENTS * REQUESTS_PER_CLIENT,
                "failed": 0,
                "redis_down_s": OUTAGE_S,
                "completed_while_down": num_during,
                "pods_registered_and_seen_after_s": round(registered_s, 1),
                "kv_back_to_baseline_s": round(kv_s, 1),
            }
        )
    )
