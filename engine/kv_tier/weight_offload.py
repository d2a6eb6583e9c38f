"""Weight offload (`cpu_offload_gb`): some decoder layers keep their weights in host memory and are copied to the
device just before they run.

At start-up, after the weights are loaded, `offload_layers`:
1. picks the last layers of the stage, as few as save at least `cpu_offload_gb` of device memory;
2. copies each picked layer's parameters and buffers to host tensors (pinned on CUDA);
3. points every picked layer's tensors at one set of device tensors, the first picked layer's own (the staging
   set: decoder layers all have the same tensors), and frees the others' device memory;
4. registers a forward pre-hook on each picked layer that copies its host tensors into the staging set.
The copies are enqueued on the current stream like any kernel, so CUDA graphs capture them too. Saving `n - 1`
layers' memory costs the copy of `n` layers every step. On CPU the same copies run (no memory is saved): the path
the tests check.

NOTE: the weights are loaded to the device first: the saving goes to the KV pool, sized after this.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _layer_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def _nbytes(layer: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in _layer_tensors(layer).values())


def layers_to_offload(layer_nbytes: list[int], cpu_offload_gb: float) -> list[int]:
    """Indices of the last layers, as few as save `cpu_offload_gb` GiB (each saves its bytes, but one staging set
    stays on the device); all of them if that is not enough, none for 0."""
    budget = cpu_offload_gb * 2**30
    if budget <= 0:
        return []
    picked: list[int] = []
    for index in reversed(range(len(layer_nbytes))):
        picked.append(index)
        if sum(layer_nbytes[i] for i in picked) - max(layer_nbytes[i] for i in picked) >= budget:
            break
    return sorted(picked)


class OffloadedLayer:
    """One layer's host copies and the staging tensors its forward pre-hook copies them into."""

    def __init__(self, layer: nn.Module, staging: dict[str, torch.Tensor]) -> None:
        pin = next(iter(staging.values())).device.type == "cuda"
        tensors = _layer_tensors(layer)
        if {n: (t.shape, t.dtype) for n, t in tensors.items()} != {n: (t.shape, t.dtype) for n, t in staging.items()}:
            raise ValueError("offloaded layers must have the same tensors")
        self.host = {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()}
        if pin:
            self.host = {name: tensor.pin_memory() for name, tensor in self.host.items()}
        self.staging = staging
        self._non_blocking = pin
        for name, tensor in tensors.items():
            if tensor.data_ptr() != staging[name].data_ptr():
                tensor.data = staging[name]
        self.num_copies = 0
        layer.register_forward_pre_hook(self.copy_in)

    def copy_in(self, module: nn.Module, args: Any) -> None:
        for name, host in self.host.items():
            self.staging[name].copy_(host, non_blocking=self._non_blocking)
        self.num_copies += 1


def offload_layers(layers: list[nn.Module], cpu_offload_gb: float) -> list[OffloadedLayer]:
    """Offload the last of `layers` (one pipeline stage's decoder layers, in order) as the module docstring says;
    the offloaded layers' handles, in layer order."""
    picked = layers_to_offload([_nbytes(layer) for layer in layers], cpu_offload_gb)
    if not picked:
        return []
    staging = {name: tensor.data for name, tensor in _layer_tensors(layers[picked[0]]).items()}
    offloaded = [OffloadedLayer(layers[index], staging) for index in picked]
    saved = sum(_nbytes(layers[i]) for i in picked[1:])
    if next(iter(staging.values())).device.type == "cuda":
        torch.cuda.empty_cache()
    logger.info(
        "weights of %d layers offloaded to host memory (%.2f GiB of device memory saved)", len(picked), saved / 2**30
    )
    return offloaded
