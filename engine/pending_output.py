"""A step's sampled tokens on their way to the host: the runner returns at once, `result()` waits for the device."""

from __future__ import annotations

import torch

from engine.sampler import SamplerOutput
from engine.scheduler_output import RunnerOutput


class PendingOutput:
    """Starts the device-to-host copy of a step's sampled tokens (and log-probs) without waiting for it."""

    def __init__(self, req_ids: list[str], sampled: SamplerOutput) -> None:
        self._req_ids = req_ids
        self._event: torch.cuda.Event | None = None
        if sampled.token_ids.device.type == "cuda":
            # NOTE: pinned host tensors come from torch's caching host allocator, which keeps each one until the
            # copy that targets it has run; the event marks when both copies have.
            sampled = SamplerOutput(
                _to_pinned(sampled.token_ids), None if sampled.logprobs is None else _to_pinned(sampled.logprobs)
            )
            self._event = torch.cuda.Event()
            self._event.record()
        self._sampled = sampled

    def result(self) -> RunnerOutput:
        if self._event is not None:
            self._event.synchronize()
        token_ids, logprobs = self._sampled.to_lists()
        return RunnerOutput(
            dict(zip(self._req_ids, token_ids, strict=True)), dict(zip(self._req_ids, logprobs, strict=True))
        )


def _to_pinned(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


NO_OUTPUT = PendingOutput([], SamplerOutput(torch.empty(0, dtype=torch.int64), None))
