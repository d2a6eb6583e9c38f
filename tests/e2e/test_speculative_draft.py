"""Draft-model speculation through the router: the decode pod drafts with SmolLM2 itself (the packaged alias as
`model`, resolved on the pod) and prefills the draft's KV from the prompt it received; a request streams the same
greedy tokens as the offline engine without speculation, and (nearly) every proposal is accepted. Its own 1 prefill
+ 1 decode cluster (soak: a cluster start is too long for the default run)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from client.generation_client import GenerationClient
from engine.config import DEFAULT_MODEL
from tests.e2e.support import POD_ARGS, REGISTRY_REFRESH_S, STARTUP_TIMEOUT_S, Oracle, run
from tests.e2e.test_observability import scrape

SPECULATIVE_CONFIG = {"method": "draft_model", "model": DEFAULT_MODEL, "num_speculative_tokens": 4}
PROMPT = "Repeat this list exactly: apple, banana, cherry, grape, lemon, mango. Again: apple, banana, cherry,"
MAX_TOKENS = 24

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def draft_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = ClusterConfig(
        num_prefill=1,
        num_decode=1,
        port=0,
        registry_refresh_s=REGISTRY_REFRESH_S,
        pod_args=(*POD_ARGS, "--speculative-config", json.dumps(SPECULATIVE_CONFIG)),
        log_dir=tmp_path_factory.mktemp("draft-cluster-logs"),
        startup_timeout_s=STARTUP_TIMEOUT_S,
        metrics_port=0,
    )
    with LocalCluster(config) as cluster:
        yield cluster


def test_drafting_decode_pod_streams_the_same_tokens(draft_cluster: LocalCluster, oracle: Oracle) -> None:
    [decode_url] = [url for name, url in draft_cluster.metrics_urls.items() if name.startswith("decode")]
    with GenerationClient(draft_cluster.router_address) as client:
        completion = run(client, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    assert completion.token_ids == oracle.greedy([PROMPT], MAX_TOKENS)[0].token_ids
    samples = scrape(decode_url)
    draft, accepted = samples["pdserve:spec_draft_tokens_total"], samples["pdserve:spec_accepted_tokens_total"]
    assert draft > 0 and accepted >= 0.9 * draft
