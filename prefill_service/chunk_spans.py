"""ChunkSpans: one span per prefill chunk, a child of the request's "prefill" span, from the engine core's progress.

The Prefill call captures its trace context (`common.telemetry.capture_context`) and starts tracking its request
(`track`); after every engine step that advanced the prompt, the core reports how far it is computed
(`engine.core.outputs.PrefillProgress`), which `on_progress` turns into a span from the step's start to the time the
pod received the report. It also notes when each request was first scheduled (its queue time ends there), which the
call reads once its first token is out. Everything runs on the pod's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from common.telemetry import PDSERVE_KV_TRANSFER_ID
from engine.core.outputs import PrefillProgress

CHUNK_SPAN = "prefill.chunk"
CHUNK_START_TOKEN = "pdserve.prefill.chunk.start_token"
CHUNK_NUM_TOKENS = "pdserve.prefill.chunk.num_tokens"


@dataclass(slots=True)
class _Tracked:
    parent: otel_context.Context
    num_prompt_tokens: int
    num_computed_tokens: int = -1
    """-1 until the first report (the tokens found in the prefix cache are no chunk)."""


class ChunkSpans:
    """See the module docstring."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._tracked: dict[str, _Tracked] = {}
        self._first_scheduled_ns: dict[str, int] = {}

    def track(self, transfer_id: str, num_prompt_tokens: int, parent: otel_context.Context) -> None:
        self._tracked[transfer_id] = _Tracked(parent, num_prompt_tokens)

    def on_progress(self, progress: PrefillProgress, step_started_ns: int, now_ns: int) -> None:
        """A span for the chunk the step computed; tracking stops once the prompt is computed."""
        tracked = self._tracked.get(progress.req_id)
        if tracked is None:
            return
        start = tracked.num_computed_tokens
        if start < 0:
            # NOTE: the first report after admission: tokens before this step's chunk were prefix cache hits.
            start = progress.num_cached_tokens
        if progress.num_computed_tokens > start:
            self._first_scheduled_ns.setdefault(progress.req_id, step_started_ns)
            num_tokens = progress.num_computed_tokens - start
            self._span(progress.req_id, tracked.parent, start, num_tokens, step_started_ns, now_ns)
        tracked.num_computed_tokens = progress.num_computed_tokens
        if progress.num_computed_tokens >= tracked.num_prompt_tokens:
            del self._tracked[progress.req_id]

    def forget(self, transfer_id: str) -> int | None:
        """Stop tracking the request; when its first chunk started (time.time_ns), None if it never ran."""
        self._tracked.pop(transfer_id, None)
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
