"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start before the previous
kernel in the stream has finished, up to its `griddepcontrol.wait` (`tl.extra.cuda.gdc_wait`), which waits for
that kernel's completion and memory. A kernel that calls `gdc_launch_dependents` early lets its PDL successor
start then (without it, when its programs exit). Used by the batch-1 GEMVs (their first weights load before the
wait) and the kernels before them in a decoder layer (RMSNorm, SiLU-mul: they signal at their start). Where the
GEMVs launch with it (`LinearMethod.gemv_pdl`: int4), the kernels between them do too (RMSNorm, q/k norm + RoPE +
store, decode attention), each waiting for its predecessor at its start.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` may use grid dependency control: CUDA, compute capability 9.0 or more (the
    instructions do not compile for older GPUs, and Triton's interpreter on the CPU does not run them), and a
    Triton that has it (`tl.extra.cuda.gdc_wait`)."""
    has_gdc = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
    return has_gdc and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def pdl_launch(pdl: bool) -> dict[str, bool]:
    """The launch keywords of a kernel launched with PDL (`pdl`) or not: only a PDL launch names the option."""
    return {"launch_pdl": True} if pdl else {}
