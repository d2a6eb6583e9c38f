"""ChunkSpans: one span per prefill chunk, opened on the engine thread as a child of the request's "prefill" span.

The Prefill call captures its trace context on the event loop (`common.telemetry.capture_context`) and hands it
over with the request (`track`, inside the engine command that adds it); after every step, `on_step` turns each
tracked request's progress into a span from the step's start to now. It also notes when each request was first
scheduled (its queue time ends there), which the call reads once its first token is out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from common.telemetry import PDSERVE_KV_TRANSFER_ID
from engine.llm_engine import LLMEngine

CHUNK_SPAN = "prefill.chunk"
CHUNK_START_TOKEN = "pdserve.prefill.chunk.start_token"
CHUNK_NUM_TOKENS = "pdserve.prefill.chunk.num_tokens"


@dataclass(slots=True)
class _Tracked:
    parent: otel_context.Context
    num_prompt_tokens: int
    num_computed_tokens: int = -1
    """-1 until the first step after `track` (the tokens found in the prefix cache are no chunk)."""


class ChunkSpans:
    """`track` and `on_step` run on the engine thread only; `pop_first_scheduled_ns` on any thread."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._tracked: dict[str, _Tracked] = {}
        self._first_scheduled_ns: dict[str, int] = {}

    def track(self, transfer_id: str, num_prompt_tokens: int, parent: otel_context.Context) -> None:
        self._tracked[transfer_id] = _Tracked(parent, num_prompt_tokens)

    def on_step(self, engine: LLMEngine, step_started_ns: int) -> None:
        """A span for each tracked request the step computed prompt tokens of; stop tracking finished ones."""
        now_ns = time.time_ns()
        for transfer_id, tracked in list(self._tracked.items()):
            progress = engine.kv_progress(transfer_id)
            if progress is None:
                del self._tracked[transfer_id]
                continue
            num_computed = progress[1]
            start = tracked.num_computed_tokens
            if start < 0:
                # NOTE: the first step after admission: tokens before this step's chunk were prefix cache hits.
                request = engine.scheduler.requests.get(transfer_id)
                start = (request.num_cached_tokens or 0) if request is not None else 0
            if num_computed > start:
                self._first_scheduled_ns.setdefault(transfer_id, step_started_ns)
                self._span(transfer_id, tracked.parent, start, num_computed - start, step_started_ns, now_ns)
            tracked.num_computed_tokens = num_computed
            if num_computed >= tracked.num_prompt_tokens:
                del self._tracked[transfer_id]

    def pop_first_scheduled_ns(self, transfer_id: str) -> int | None:
        """When the request's first chunk started (time.time_ns), once; None if it never ran."""
        return self._first_scheduled_ns.pop(transfer_id, None)

    def _span(
        self,
        transfer_id: str,
        parent: otel_context.Context,
        start_token: int,
        num_tokens: int,
        start_ns: int,
        end_ns: int,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            PDSERVE_KV_TRANSFER_ID: transfer_id,
            CHUNK_START_TOKEN: start_token,
            CHUNK_NUM_TOKENS: num_tokens,
        }
        span = self._tracer.start_span(CHUNK_SPAN, context=parent, attributes=attributes, start_time=start_ns)
        span.end(end_time=end_ns)
