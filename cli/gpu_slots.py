"""`GpuSlots`: which GPU of a local cluster's `gpus` each live pod holds (cli/cluster_config.py has the rule)."""

from __future__ import annotations

from collections.abc import Iterable

from cli.cluster_config import ClusterConfig


class GpuSlots:
    """The GPU of each pod started on `config.gpus`, until the pod is released (it exited)."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config
        self._pods: dict[str, int] = {}

    def take(self, pod_id: str, live: Iterable[str]) -> str | None:
        """Give `pod_id` the next GPU (`ClusterConfig.next_gpu`) among the `live` pods' ones; its
        CUDA_VISIBLE_DEVICES, or None without `gpus`."""
        gpu = self._config.next_gpu(self.taken(live))
        if gpu is None:
            return None
        self._pods[pod_id] = gpu
        return self._config.visible_devices(gpu)

    def next_is_free(self, live: Iterable[str]) -> bool:
        """Whether the next pod's GPU is one no `live` pod holds (True without `gpus`)."""
        taken = self.taken(live)
        gpu = self._config.next_gpu(taken)
        return gpu is None or gpu not in taken

    def taken(self, live: Iterable[str]) -> list[int]:
        """The GPU of each `live` pod, with repeats."""
        return [gpu for pod_id in live if (gpu := self._pods.get(pod_id)) is not None]

    def release(self, pod_id: str) -> None:
        self._pods.pop(pod_id, None)
