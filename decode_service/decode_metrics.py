"""The decode pod's measurements of one request: its metrics and its "decode.admission" / "decode.generate" spans.

1. Created when its DecodeStart arrives: the "decode.admission" span opens (waiting for the transfer, admission), in
   the request's trace (the DecodeStart's trace context).
2. `tokens(n, now)` per step that gave it tokens: the first closes "decode.admission" and opens "decode.generate";
   each counts its tokens, with the inter-token latency after the first.
3. `ended(finish_reason)`: "decode.generate" closes with its token count and finish reason, and the request's
   latencies are observed (decode time: from its first decode token to its last). A request that ends without a
   finish reason (cancelled, failed) is only closed.
"""

from __future__ import annotations

import time

from opentelemetry import context as otel_context
from opentelemetry import trace

from common.metrics import ServiceMetrics
from common.telemetry import (
    EVENT_DECODE_ADMITTED,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PDSERVE_KV_TRANSFER_ID,
    PDSERVE_REQUEST_ID,
    Tracing,
)

EVENT_FIRST_DECODE_TOKEN = "first_decode_token"


class DecodeMeasure:
    """One request's decode measurements; see the module docstring."""

    def __init__(
        self,
        tracing: Tracing,
        metrics: ServiceMetrics,
        request_id: str,
        transfer_id: str,
        parent: otel_context.Context | None = None,
    ) -> None:
        """`parent`: the request's trace context (its DecodeStart's), which the spans continue."""
        self.request_id = request_id
        self._tracer = tracing.tracer
        self._metrics = metrics
        self._attributes = {PDSERVE_REQUEST_ID: request_id, PDSERVE_KV_TRANSFER_ID: transfer_id}
        self._arrival = time.monotonic()
        self._parent = parent
        self._admission = self._tracer.start_span("decode.admission", context=parent, attributes=self._attributes)
        self._generate: trace.Span | None = None
        self._last = 0.0
        self._num_tokens = 0

    def tokens(self, num_tokens: int, now: float) -> None:
        if self._generate is None:
            self._admission.add_event(EVENT_DECODE_ADMITTED)
            self._admission.end()
            self._generate = self._tracer.start_span(
                "decode.generate", context=self._parent, attributes=self._attributes
            )
            self._generate.add_event(EVENT_FIRST_DECODE_TOKEN)
            self._metrics.observe_output_tokens(num_tokens)
        else:
            self._metrics.observe_output_tokens(num_tokens, now - self._last)
        self._last = now
        self._num_tokens += num_tokens

    def ended(self, finish_reason: str | None) -> None:
        span = self._generate
        if span is None:
            self._admission.end()
            return
        if finish_reason is not None:
            # NOTE: the request's output tokens count the first one, which came from the prefill pod.
            num_output_tokens = self._num_tokens + 1
            span.set_attributes(
                {GEN_AI_USAGE_OUTPUT_TOKENS: num_output_tokens, GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason]}
            )
            decode_s = self._last - self._arrival
            self._metrics.observe_finished(finish_reason, decode_s, num_output_tokens, decode_s=decode_s)
        span.end()
