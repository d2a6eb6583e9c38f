"""A beam search request on the cluster: one completion run whose decode pod runs the whole search.

The leg is the usual Reserve + Prefill + Decode (`router.completion.completion_leg`): the prefill pod computes the
prompt's KV (greedily, its first token unused) and ships it to the decode pod, which recomputes the prompt's last
token for its logits and runs the beams there, sharing the transferred prompt blocks copy-on-write
(`engine.beam.beam_search`). Nothing streams while the beams run: the decode stream's end carries the n beams, best
first, and they go out as completions 0..n-1, each one finished chunk. A failed leg starts the search again on
another pair (`CompletionRun`'s retries; no token was emitted).
"""

from __future__ import annotations

from common.detokenizer import IncrementalDetokenizer
from router.completion.completion_leg import CompletionLeg, LegFailed
from router.completion.completion_run import CompletionRun
from router.completion.migration import LegInput
from router.outputs import BeamResult, CompletionChunk, FirstToken


class BeamSearchRun(CompletionRun):
    """Runs a beam search request (its params' use_beam_search); iterate `run()` once."""

    async def _open(self, leg: CompletionLeg, leg_input: LegInput) -> tuple[FirstToken, list[CompletionChunk]]:
        """The whole search on the leg: its first token (unused) and one finished chunk per returned beam."""
        first = await leg.open()
        if self._progress.first is None:
            self._progress.first = first
        leg.start_decode(first.token_id)
        end = await leg.next_step()
        while end.finish_reason is None:
            end = await leg.next_step()
        if not end.beams:
            raise LegFailed(leg.decode_pod.pod_id, f"decode pod {leg.decode_pod.pod_id} returned no beams")
        leg.finished()
        self._progress.time_to_first_token_s = self._elapsed()
        metrics = self._metrics(leg, await leg.transfer_result())
        best = end.beams[0]
        self._ctx.metrics.observe_finished(best.finish_reason or "length", self._elapsed(), len(best.token_ids))
        return first, [
            CompletionChunk(
                index,
                self._text(beam),
                beam.token_ids,
                beam.logprobs if self._params.logprobs else (),
                beam.finish_reason or "length",
                beam.stop_reason,
                metrics,
                num_cached_tokens=first.num_cached_tokens,
                cumulative_logprob=beam.cumulative_logprob,
            )
            for index, beam in enumerate(end.beams)
        ]

    def _text(self, beam: BeamResult) -> str:
        detokenizer = IncrementalDetokenizer(self._ctx.tokenizer, self._plan.token_ids)
        detokenizer.update(beam.token_ids)
        detokenizer.flush()
        return detokenizer.output_text
