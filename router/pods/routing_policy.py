"""Which prefill pod and which decode pod serve a request.

Prefill: a pod holding a cached prefix of the prompt saves computing those tokens; a pod with a
queue delays the first token. Each pod scores `cached_blocks * block_size - alpha * queued_tokens`
and the best wins. When no pod holds even the first block (a cold prefix, or the directory did not
answer), the pick is rendezvous hashing on the prompt's first block hash, so requests sharing a
prefix meet on one pod and warm its cache; a pod whose queue exceeds the shortest one by more than
`prefill_max_imbalance_tokens` is passed over for the next in rendezvous order (bounded load).
Rendezvous order also breaks every tie.

Decode: the pod must reserve the prompt's blocks now and grow to the whole request later. Pods
with room for the whole request (prompt + max_tokens) come first, then those with room for the
prompt, then the rest; within a tier, fewer running requests (a smaller decode batch steps
faster), then more free blocks, then pod id.

Parallel pods: the prefill pod is picked among those that have a decode pod of their TP/PP sizes
(`pairable_prefill_pods`), the decode pod among those of the prefill pod's sizes (`paired_decode_pods`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from common.errors import UnavailableError
from common.pod_registry import PodInfo
from router.config import RoutingConfig
from router.pods.local_load import LocalLoad


def rendezvous_order(key: bytes, pod_ids: Sequence[str]) -> list[str]:
    """`pod_ids` by descending rendezvous weight H(key, pod_id): stable, and a pod joining or leaving
    moves only the keys it wins or held."""

    def weight(pod_id: str) -> bytes:
        return hashlib.blake2b(key + b"\x00" + pod_id.encode(), digest_size=8).digest()

    return sorted(pod_ids, key=weight, reverse=True)


def parallel_sizes(pod: PodInfo) -> tuple[int, int]:
    """A pod's (tensor_parallel_size, pipeline_parallel_size): a prefill pod ships KV only to a decode pod of equal
    sizes."""
    return pod.tensor_parallel_size, pod.pipeline_parallel_size


def pairable_prefill_pods(prefill_pods: Sequence[PodInfo], decode_pods: Sequence[PodInfo]) -> list[PodInfo]:
    """The prefill pods for which a decode pod of their sizes takes requests; all of them where none has one (the
    prefill pod then refuses the KV target, naming both sizes)."""
    sizes = {parallel_sizes(pod) for pod in decode_pods if not pod.draining}
    return [pod for pod in prefill_pods if parallel_sizes(pod) in sizes] or list(prefill_pods)


def paired_decode_pods(decode_pods: Sequence[PodInfo], prefill_pod: PodInfo) -> list[PodInfo]:
    """The decode pods of `prefill_pod`'s sizes; all of them where none is."""
    sizes = parallel_sizes(prefill_pod)
    return [pod for pod in decode_pods if parallel_sizes(pod) == sizes] or list(decode_pods)


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class RoutingPolicy:
    """Picks pods from the live, non-draining ones; see the module docstring for the rules."""

    def __init__(self, block_size: int, config: RoutingConfig | None = None) -> None:
        self._block_size = block_size
        self._config = config or RoutingConfig()

    def pick_prefill(
        self,
        pods: Sequence[PodInfo],
        routing_key: bytes,
        cached_blocks: Mapping[str, float],
        load: Callable[[str], LocalLoad],
    ) -> PodInfo:
        """The prefill pod for a prompt whose first block hashes to `routing_key`.

        `cached_blocks`: the directory's answer (pod id -> leading blocks of the prompt it holds, a block in its host
        tier counting `host_hit_weight`;
        empty when it had none). Raises UnavailableError when no pod can take it.
        """
        by_id = {pod.pod_id: pod for pod in pods if not pod.draining}
        if not by_id:
            raise UnavailableError("no prefill pod is available")
        order = rendezvous_order(routing_key, list(by_id))
        queued = {pod_id: load(pod_id).queued_prefill_tokens for pod_id in order}
        if not any(cached_blocks.get(pod_id, 0) for pod_id in order):
            bound = min(queued.values()) + self._config.prefill_max_imbalance_tokens
            return by_id[next(pod_id for pod_id in order if queued[pod_id] <= bound)]
        alpha = self._config.prefill_load_alpha

        def score(pod_id: str) -> float:
            return cached_blocks.get(pod_id, 0) * self._block_size - alpha * queued[pod_id]

        # NOTE: max() keeps the first of equal scores, i.e. the earliest in rendezvous order.
        return by_id[max(order, key=score)]

    def pick_decode(
        self,
        pods: Sequence[PodInfo],
        num_prompt_tokens: int,
        max_tokens: int,
        load: Callable[[str], LocalLoad],
    ) -> PodInfo:
        """The decode pod for a request; raises UnavailableError when no pod can take it.

        Free blocks and running requests are the pod's last report corrected by this router's own
        reservations since then; the pod's Reserve has the last word.
        """
        candidates = [pod for pod in pods if not pod.draining]
        if not candidates:
            raise UnavailableError("no decode pod is available")
        prompt_blocks = _blocks(num_prompt_tokens, self._block_size)
        request_blocks = _blocks(num_prompt_tokens + max_tokens, self._block_size)

        def rank(pod: PodInfo) -> tuple[int, int, int, str]:
            local = load(pod.pod_id)
            free = pod.num_free_blocks - local.num_reserved_blocks
            running = max(pod.num_running + pod.num_waiting, local.num_decoding)
            tier = 0 if free >= request_blocks else 1 if free >= prompt_blocks else 2
            return tier, running, -free, pod.pod_id

        return min(candidates, key=rank)
