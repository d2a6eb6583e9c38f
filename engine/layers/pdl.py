"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start before the previous
kernel in the stream has finished, up to its `griddepcontrol.wait` (`tl.extra.cuda.gdc_wait`), which waits for
that kernel's completion and memory. A kernel that calls `gdc_launch_dependents` early lets its PDL successor
start then (without it, when its programs exit). Used by the batch-1 GEMVs (their first weights load before the
wait) and the kernels before them in a decoder layer (RMSNorm, SiLU-mul: they signal at their start).

The small kernels of a decode step (RMSNorm, q/k norm + RoPE + store, decode attention and its reduce) and the
bf16 GEMV (lm_head, unquantized projections) are PDL launches too where `pdl_launches.json` beside this file names
them: each signals its successor at its start, reads
only inputs that no kernel of the step writes (weights, positions, the attention metadata) before its wait, and
waits in every program before it reads the predecessor's output, writes anything or returns.
NOTE: waiting before every return keeps completion transitive: kernel N ends only after kernel N - 1 has ended, so a
PDL successor's one wait covers every earlier kernel too.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import triton.language as tl

TABLE_PATH = Path(__file__).with_name("pdl_launches.json")


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` may use grid dependency control: CUDA, compute capability 9.0 or more (the
    instructions do not compile for older GPUs, and Triton's interpreter on the CPU does not run them), and a
    Triton that has it (`tl.extra.cuda.gdc_wait`)."""
    has_gdc = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
    return has_gdc and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


@functools.cache
def pdl_launches(path: Path | None = None) -> frozenset[str]:
    """The small kernels the table (default: TABLE_PATH) turns into PDL launches ({kernel name: bool}; a missing
    file: none)."""
    try:
        table = json.loads((path or TABLE_PATH).read_text())
    except FileNotFoundError:
        return frozenset()
    return frozenset(name for name, on in table.items() if on)


def pdl_launch(kernel: str, device: torch.device) -> bool:
    """Whether `kernel` ("rms_norm", "qk_norm_rope_store", "decode_attention", "gemv": the bf16 one-row GEMV) runs
    as a PDL launch on `device`."""
    return kernel in pdl_launches() and pdl_supported(device)
