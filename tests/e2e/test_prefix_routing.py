"""Acceptance 3: requests sharing a 512-token prefix land on one prefill pod and hit its prefix cache; two
different long prefixes use both prefill pods."""

from __future__ import annotations

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.block_hash import block_extra_keys, hash_prompt_blocks
from router.pods.routing_policy import rendezvous_order
from tests.e2e.support import BLOCK_SIZE, MIN_CACHED, PREFIX_TOKENS, sequential, token_prefix


def first_choice(prefix: list[int], pod_ids: list[str]) -> str:
    """The prefill pod the router picks for a prefix no pod has cached (rendezvous on its first block)."""
    [first_hash, *_] = hash_prompt_blocks(prefix, BLOCK_SIZE, block_extra_keys("smollm2-135m"))
    return rendezvous_order(first_hash, pod_ids)[0]


def test_ten_requests_sharing_a_prefix_meet_on_one_pod_and_hit_its_cache(
    cluster: LocalCluster, client: GenerationClient
) -> None:
    completions = sequential(client, token_prefix(seed=1), 10)
    assert len({c.metrics.prefill_pod_id for c in completions}) == 1
    assert [c.usage.cached_prompt_tokens >= MIN_CACHED for c in completions[1:]] == [True] * 9, [
        c.usage.cached_prompt_tokens for c in completions
    ]
    assert all(c.usage.prompt_tokens == PREFIX_TOKENS + 3 for c in completions)


def test_two_long_prefixes_use_both_prefill_pods(cluster: LocalCluster, client: GenerationClient) -> None:
    pod_ids = sorted(pod.pod_id for pod in cluster.pod_infos() if pod.role == "prefill")
    assert len(pod_ids) == 2
    # NOTE: a cold prefix goes to its rendezvous winner, so equal prefixes meet; two prefixes picked to
    # win on different pods must then be served by different pods (and stay there once cached).
    prefix_a = token_prefix(seed=2)
    prefix_b = next(
        p for p in map(token_prefix, range(3, 100)) if first_choice(p, pod_ids) != first_choice(prefix_a, pod_ids)
    )
    runs_a = sequential(client, prefix_a, 3)
    runs_b = sequential(client, prefix_b, 3)
    runs_a += sequential(client, prefix_a, 1, start=3)
    served = [(c.metrics.prefill_pod_id, c.usage.cached_prompt_tokens, c.metrics.num_attempts) for c in runs_a + runs_b]
    pods_a = {c.metrics.prefill_pod_id for c in runs_a}
    pods_b = {c.metrics.prefill_pod_id for c in runs_b}
    assert len(pods_a) == 1 and len(pods_b) == 1 and pods_a | pods_b == set(pod_ids), served
    assert all(c.usage.cached_prompt_tokens >= MIN_CACHED for c in [*runs_a[1:], *runs_b[1:]]), served
