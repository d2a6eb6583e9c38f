"""The decode pod's per-token measurements of one request: metrics and the "decode.generate" span."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from opentelemetry import trace

from common.metrics import ServiceMetrics
from common.telemetry import GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_USAGE_OUTPUT_TOKENS
from engine.scheduler_output import EngineOutput

EVENT_FIRST_DECODE_TOKEN = "first_decode_token"


async def measured(
    outputs: AsyncIterator[EngineOutput], metrics: ServiceMetrics, arrival: float, span: trace.Span
) -> AsyncIterator[EngineOutput]:
    """The outputs, with the decode pod's metrics and the "decode.generate" span's event and attributes
    (`arrival`: when the Decode call arrived, by time.monotonic(); the request is admitted when iteration starts)."""
    admitted = last = time.monotonic()
    num_tokens = 0
    async for output in outputs:
        now = time.monotonic()
        if output.new_token_ids:
            if num_tokens == 0:
                span.add_event(EVENT_FIRST_DECODE_TOKEN)
            itl = None if num_tokens == 0 else now - last
            num_tokens += len(output.new_token_ids)
            metrics.observe_output_tokens(len(output.new_token_ids), itl)
            last = now
        if output.finish_reason is not None:
            span.set_attributes(
                {GEN_AI_USAGE_OUTPUT_TOKENS: num_tokens + 1, GEN_AI_RESPONSE_FINISH_REASONS: [output.finish_reason]}
            )
            metrics.observe_finished(output.finish_reason, now - arrival, num_tokens + 1, decode_s=now - admitted)
        yield output
