"""pdserve's model executor, shared by the prefill and decode services.

Public API: `from engine import LLM, SamplingParams`. `LLM` is loaded on first access so that
`import engine` (and light modules such as `engine.config`) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
