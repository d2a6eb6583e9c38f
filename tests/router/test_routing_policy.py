"""RoutingPolicy: exact picks for prefix hits, load, rendezvous fallback, draining pods and decode headroom."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import pytest

from common.errors import UnavailableError
from common.pod_registry import PodInfo
from router.config import RoutingConfig
from router.pods.local_load import LocalLoad, LocalLoads
from router.pods.routing_policy import RoutingPolicy, pairable_prefill_pods, paired_decode_pods, rendezvous_order

BLOCK_SIZE = 16
KEY = hashlib.blake2b(b"first block", digest_size=16).digest()


def _prefill(pod_id: str, draining: bool = False) -> PodInfo:
    return PodInfo(pod_id=pod_id, role="prefill", address=f"{pod_id}:1", model="m", generation=1, draining=draining)


def _decode(pod_id: str, free: int, running: int = 0, waiting: int = 0, draining: bool = False) -> PodInfo:
    return PodInfo(
        pod_id=pod_id,
        role="decode",
        address=f"{pod_id}:1",
        model="m",
        generation=1,
        draining=draining,
        num_running=running,
        num_waiting=waiting,
        num_free_blocks=free,
        num_total_blocks=1000,
    )


def _idle(pod_id: str) -> LocalLoad:
    return LocalLoad()


def _queued(**tokens: int) -> Callable[[str], LocalLoad]:
    return lambda pod_id: LocalLoad(queued_prefill_tokens=tokens.get(pod_id, 0))


PREFILLS = [_prefill("p0"), _prefill("p1"), _prefill("p2")]
POLICY = RoutingPolicy(BLOCK_SIZE, RoutingConfig(prefill_load_alpha=1.0, prefill_max_imbalance_tokens=100))


def test_rendezvous_order_is_stable_and_minimal_on_membership_change() -> None:
    order = rendezvous_order(KEY, ["p0", "p1", "p2"])
    assert sorted(order) == ["p0", "p1", "p2"]
    assert rendezvous_order(KEY, ["p2", "p0", "p1"]) == order
    # removing a pod keeps the relative order of the others
    assert rendezvous_order(KEY, [p for p in order if p != order[1]]) == [order[0], order[2]]


def test_longest_cached_prefix_wins() -> None:
    cached = {"p0": 1, "p1": 4, "p2": 2}
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _idle).pod_id == "p1"


def test_load_outweighs_a_tiny_prefix_and_a_long_prefix_outweighs_load() -> None:
    cached = {"p0": 1, "p1": 0, "p2": 0}
    # p0 saves 16 tokens but has 40 queued; p1 and p2 are idle: the earlier of them in rendezvous order wins.
    load = _queued(p0=40)
    idle_first = next(p for p in rendezvous_order(KEY, ["p0", "p1", "p2"]) if p != "p0")
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, load).pod_id == idle_first
    # 10 cached blocks (160 tokens) beat 40 queued tokens.
    assert POLICY.pick_prefill(PREFILLS, KEY, {"p0": 10}, load).pod_id == "p0"


def test_equal_prefixes_are_broken_by_load_then_rendezvous() -> None:
    cached = {"p0": 3, "p1": 3, "p2": 0}
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _queued(p0=5)).pod_id == "p1"
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _queued(p1=5)).pod_id == "p0"
    first_of_two = rendezvous_order(KEY, ["p0", "p1"])[0]
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _idle).pod_id == first_of_two


def test_without_directory_answer_rendezvous_keeps_prefixes_together_and_spreads_others() -> None:
    keys = [hashlib.blake2b(str(i).encode(), digest_size=16).digest() for i in range(60)]
    picks = [POLICY.pick_prefill(PREFILLS, key, {}, _idle).pod_id for key in keys]
    assert picks == [rendezvous_order(key, ["p0", "p1", "p2"])[0] for key in keys]
    # the same key always lands on the same pod, whatever the pod list order
    assert [POLICY.pick_prefill(PREFILLS[::-1], key, {}, _idle).pod_id for key in keys] == picks
    counts = {pod_id: picks.count(pod_id) for pod_id in ("p0", "p1", "p2")}
    assert min(counts.values()) >= 10, counts
    # an all-zero answer is no answer
    no_answer = {"p0": 0, "p1": 0, "p2": 0}
    assert POLICY.pick_prefill(PREFILLS, KEY, no_answer, _idle).pod_id == rendezvous_order(KEY, ["p0", "p1", "p2"])[0]


def test_rendezvous_pick_is_kept_under_bounded_load_and_skipped_beyond() -> None:
    order = rendezvous_order(KEY, ["p0", "p1", "p2"])
    within = _queued(**{order[0]: 100})
    assert POLICY.pick_prefill(PREFILLS, KEY, {}, within).pod_id == order[0]
    beyond = _queued(**{order[0]: 101})
    assert POLICY.pick_prefill(PREFILLS, KEY, {}, beyond).pod_id == order[1]


def test_draining_pods_are_never_picked() -> None:
    order = rendezvous_order(KEY, ["p0", "p1", "p2"])
    pods = [_prefill(p, draining=(p == order[0])) for p in ("p0", "p1", "p2")]
    assert POLICY.pick_prefill(pods, KEY, {}, _idle).pod_id == order[1]
    assert POLICY.pick_prefill(pods, KEY, {order[0]: 50}, _idle).pod_id == order[1]
    with pytest.raises(UnavailableError, match="no prefill pod"):
        POLICY.pick_prefill([_prefill("p0", draining=True)], KEY, {}, _idle)
    with pytest.raises(UnavailableError, match="no decode pod"):
        POLICY.pick_decode([_decode("d0", free=100, draining=True)], 10, 10, _idle)


def test_decode_prefers_room_for_the_whole_request_then_fewer_running_then_more_free() -> None:
    # 100 prompt + 60 max tokens = 10 blocks in all, 7 for the prompt.
    full_but_busy = _decode("d0", free=10, running=5)
    prompt_only = _decode("d1", free=9, running=0)
    assert POLICY.pick_decode([prompt_only, full_but_busy], 100, 60, _idle).pod_id == "d0"
    less_busy = _decode("d2", free=10, running=2, waiting=1)
    assert POLICY.pick_decode([full_but_busy, less_busy, prompt_only], 100, 60, _idle).pod_id == "d2"
    roomier = _decode("d3", free=500, running=2, waiting=1)
    assert POLICY.pick_decode([full_but_busy, less_busy, roomier], 100, 60, _idle).pod_id == "d3"
    # nothing fits: the one that holds the prompt comes first, then the most free
    assert POLICY.pick_decode([_decode("a", free=3), prompt_only, _decode("b", free=5)], 100, 60, _idle).pod_id == "d1"
    assert POLICY.pick_decode([_decode("a", free=3), _decode("b", free=5)], 100, 60, _idle).pod_id == "b"


def test_decode_counts_this_routers_reservations_since_the_last_report() -> None:
    d0, d1 = _decode("d0", free=20), _decode("d1", free=15)
    load = LocalLoads()
    assert POLICY.pick_decode([d0, d1], 100, 60, load.get).pod_id == "d0"
    with load.decoding("d0", num_blocks=7):
        # d0: 13 free by our count, too few for 10 + 1 running; d1 still has 15 and none running.
        assert POLICY.pick_decode([d0, d1], 100, 60, load.get).pod_id == "d1"
        load.on_refresh()
        assert load.get("d0") == LocalLoad(num_decoding=1)
        assert POLICY.pick_decode([d0, d1], 100, 60, load.get).pod_id == "d1"
    assert load.get("d0") == LocalLoad()


def test_pod_load_counts_prefill_tokens_and_decodes_while_they_last() -> None:
    load = LocalLoads()
    with load.prefilling("p0", 30), load.prefilling("p0", 12):
        assert load.get("p0") == LocalLoad(queued_prefill_tokens=42)
    with load.decoding("d0", 4):
        with pytest.raises(RuntimeError), load.decoding("d0", 3):
            raise RuntimeError("a failed request still gives its count back")
        assert load.get("d0") == LocalLoad(num_decoding=1, num_reserved_blocks=7)
    assert load.get("p0") == LocalLoad()
    assert load.get("d0") == LocalLoad(num_reserved_blocks=7)
    load.on_refresh()
    assert load.get("d0") == LocalLoad()


def test_parallel_pods_pair_only_with_pods_of_their_sizes() -> None:
    tp2 = {"tensor_parallel_size": 2}
    prefill = [
        _prefill("p1"),
        dataclasses.replace(_prefill("p2"), **tp2),
        dataclasses.replace(_prefill("p3"), pipeline_parallel_size=2),
    ]
    decode = [
        _decode("d1", 10),
        dataclasses.replace(_decode("d2", 10), **tp2),
        dataclasses.replace(_decode("d3", 10, draining=True), pipeline_parallel_size=2),
    ]
    assert [pod.pod_id for pod in pairable_prefill_pods(prefill, decode)] == ["p1", "p2"]
    assert [pod.pod_id for pod in paired_decode_pods(decode, prefill[1])] == ["d2"]
    # No pod of equal sizes: every pod stays a candidate (the prefill pod then refuses the target, naming the sizes).
    assert [pod.pod_id for pod in pairable_prefill_pods(prefill[2:], decode[:2])] == ["p3"]
    assert [pod.pod_id for pod in paired_decode_pods(decode[:1], prefill[1])] == ["d1"]


def test_host_tier_hits_count_at_their_weight_against_load() -> None:
    # p0 holds 8 blocks, 6 of them only in its host tier at weight 0.5: 5 device-equivalent blocks = 80 tokens; p1
    # holds 4 blocks on its device = 64 tokens. The directory's answer is already weighted (PrefixDirectory).
    cached = {"p0": 2 + 0.5 * 6, "p1": 4}
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _idle).pod_id == "p0"
    # 20 queued tokens on p0 outweigh its 16-token edge.
    assert POLICY.pick_prefill(PREFILLS, KEY, cached, _queued(p0=20)).pod_id == "p1"
