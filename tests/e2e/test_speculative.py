"""Speculation on the decode pod through the router: a request streams the same greedy tokens as the offline engine
without speculation, and the decode pod's /metrics count the proposed and accepted tokens. Each method has its own
1 prefill + 1 decode cluster, both pods started with --speculative-config.
- n-gram (issue 13, item 5);
- draft model (soak: a second cluster start is too long for the default run): the decode pod drafts with SmolLM2
  itself (the packaged alias as `model`, resolved on the pod) and prefills the draft's KV from the prompt it
  received, so (nearly) every proposal is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from engine.config import DEFAULT_MODEL
from tests.e2e.support import Oracle, cluster_config, run
from tests.e2e.test_observability import scrape

NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
DRAFT_CONFIG = {"method": "draft_model", "model": DEFAULT_MODEL, "num_speculative_tokens": 4}
PROMPT = "Repeat this list exactly: apple, banana, cherry, grape, lemon, mango. Again: apple, banana, cherry,"
MAX_TOKENS = 24


@contextmanager
def speculating_cluster(tmp_path_factory: pytest.TempPathFactory, spec: dict[str, Any]) -> Iterator[LocalCluster]:
    config = cluster_config(
        tmp_path_factory.mktemp(f"{spec['method']}-cluster-logs"),
        "--speculative-config",
        json.dumps(spec),
        metrics_port=0,
    )
    with LocalCluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spec_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with speculating_cluster(tmp_path_factory, NGRAM_CONFIG) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def draft_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with speculating_cluster(tmp_path_factory, DRAFT_CONFIG) as cluster:
        yield cluster


def greedy_then_scrape(cluster: LocalCluster, oracle: Oracle) -> tuple[dict[str, float], float, float]:
    """The greedy request through the router, checked against the oracle; then the decode pod's metric samples and
    its (proposed, accepted) token counts."""
    [decode_url] = [url for name, url in cluster.metrics_urls.items() if name.startswith("decode")]
    with GenerationClient(cluster.router_address) as client:
        completion = run(client, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    assert completion.token_ids == oracle.greedy([PROMPT], MAX_TOKENS)[0].token_ids
    samples = scrape(decode_url)
    return samples, samples["pdserve:spec_draft_tokens_total"], samples["pdserve:spec_accepted_tokens_total"]


def test_speculating_decode_pod_streams_the_same_tokens(spec_cluster: LocalCluster, oracle: Oracle) -> None:
    samples, draft, accepted = greedy_then_scrape(spec_cluster, oracle)
    assert draft > 0 and 0 < accepted <= draft
    assert samples["pdserve:spec_acceptance_rate"] == pytest.approx(accepted / draft)
    assert samples["pdserve:spec_mean_accepted_length"] > 1.0


@pytest.mark.soak
def test_drafting_decode_pod_streams_the_same_tokens(draft_cluster: LocalCluster, oracle: Oracle) -> None:
    _, draft, accepted = greedy_then_scrape(draft_cluster, oracle)
    assert draft > 0 and accepted >= 0.9 * draft
