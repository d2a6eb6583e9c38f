"""The random initial values of the layers' parameters, which a model about to load a whole checkpoint skips.

A random-weight model (load_format="dummy") runs on these values (and on `QuantMethod.random_checkpoint`'s); a
checkpoint load overwrites every parameter and checks that it did (`load_weights`, `load_sharded_weights`), so it
builds the model inside `skipping_init()` and draws no random numbers: on the CPU, SmolLM2's 135M parameters took
0.8 s of a 1.3 s engine build to initialize.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch

_SKIP = contextvars.ContextVar("pdserve_skip_weight_init", default=False)


@contextlib.contextmanager
def skipping_init() -> Iterator[None]:
    """Parameters created inside the block keep `torch.empty`'s contents (`initialized` does nothing)."""
    token = _SKIP.set(True)
    try:
        yield
    finally:
        _SKIP.reset(token)


def initialized(tensor: torch.Tensor, fill: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """`tensor` after `fill(tensor)` (in place), unless inside `skipping_init()`."""
    if not _SKIP.get():
        fill(tensor)
    return tensor
