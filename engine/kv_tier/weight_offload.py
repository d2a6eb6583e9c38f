"""Weight offload (`cpu_offload_gb`): some decoder layers keep their weights in host memory and are copied to the
device just before they run, so a model a little too large for the device is served.

The lifecycle, at start-up:
1. before the model is built, `host_layer_range` picks the last layers of the stage, as few as save at least
   `cpu_offload_gb` of device memory, from the layers' sizes as built (measured on layers built on the `meta`
   device: `engine.models.loader.decoder_layer_nbytes`);
2. the model builds those layers in host memory and loads their weights there; each is finished
   (`process_weights_after_loading`) on the device, one layer at a time, and copied back: the device holds at most
   the other layers plus one picked layer, never the whole model;
3. `offload_layers` allocates one set of device tensors, the staging set (decoder layers all have the same
   tensors), moves each picked layer's tensors to host tensors (pinned on CUDA) and points the layer's parameters
   at the staging set;
4. a forward pre-hook on each picked layer copies its host tensors into the staging set.
The copies are enqueued on the current stream like any kernel, so CUDA graphs capture them too. Saving `n - 1`
layers' memory costs the copy of `n` layers every step. On CPU the same copies run (no memory is saved): the path
the tests check.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _layer_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def module_nbytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in _layer_tensors(module).values())


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


def host_layer_range(stage: range, layer_nbytes: list[int], cpu_offload_gb: float) -> range:
    """The layers of `stage` (`layer_nbytes`: its layers' sizes, in order) whose weights stay in host memory: the
    last ones `layers_to_offload` picks; empty for none."""
    picked = layers_to_offload(layer_nbytes, cpu_offload_gb)
    if not picked:
        return range(stage.stop, stage.stop)
    return range(stage.start + picked[0], stage.stop)


class OffloadedLayer:
    """One layer's host tensors and the staging tensors its forward pre-hook copies them into."""

    def __init__(self, layer: nn.Module, staging: dict[str, torch.Tensor]) -> None:
        pin = next(iter(staging.values())).device.type == "cuda"
        tensors = _layer_tensors(layer)
        if {n: (t.shape, t.dtype) for n, t in tensors.items()} != {n: (t.shape, t.dtype) for n, t in staging.items()}:
            raise ValueError("offloaded layers must have the same tensors")
        if any(t.device.type != "cpu" for t in tensors.values()):
            raise ValueError("offloaded layers are built in host memory")
        self.host = {name: tensor.detach().pin_memory() if pin else tensor.detach() for name, tensor in tensors.items()}
        self.staging = staging
        self._non_blocking = pin
        for name, tensor in tensors.items():
            tensor.data = staging[name]
        self.num_copies = 0
        layer.register_forward_pre_hook(self.copy_in)

    def copy_in(self, module: nn.Module, args: Any) -> None:
        for name, host in self.host.items():
            self.staging[name].copy_(host, non_blocking=self._non_blocking)
        self.num_copies += 1


def offload_layers(layers: list[nn.Module], device: torch.device) -> list[OffloadedLayer]:
    """Stream `layers` (consecutive decoder layers built in host memory, step 2 of the module docstring) to
    `device` through one staging set, as the module docstring says; their handles, in layer order."""
    if not layers:
        return []
    staging = {name: torch.empty_like(t, device=device) for name, t in _layer_tensors(layers[0]).items()}
    offloaded = [OffloadedLayer(layer, staging) for layer in layers]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    host_nbytes = sum(module_nbytes(layer) for layer in layers)
    logger.info(
        "weights of %d layers in host memory (%.2f GiB), streamed through one staging set on %s (%.2f GiB)",
        len(layers),
        host_nbytes / 2**30,
        device,
        module_nbytes(layers[0]) / 2**30,
    )
    return offloaded
