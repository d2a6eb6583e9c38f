"""W12's timeline, from what the run saw: the cluster sampled every --sample-interval-s (`PodSample`) and each request
with the time its client saw it end (`FinishedRequest`); every time is in seconds since the steady load started.

Row i of the timeline (`timeline_rows`) is the window [t_i, t_i+1) between two samples: the pods as sample i saw
them, and the requests that ended in the window (the first window also takes what ended before sample 0, the last
one what ended after the last sample): how many, how many failed, their TTFT and TPOT p90 and SLO attainment.

`final_part` judges the last --final-fraction of the run by arrival: the requests sent in it (all of them ended
before the run did) and the split the cluster held meanwhile (`split_changes` lists when the split moved).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.online.load_driver import RequestRecord
from bench.reporting.stats import percentile, slo_attainment


@dataclass(frozen=True, slots=True)
class PodSample:
    """The cluster at `t_s`: the registry's pods and the GPUs the local cluster's pod processes hold."""

    t_s: float
    prefill_pods: int
    """Active prefill pods: registered, not draining (as `decode_pods`)."""
    decode_pods: int
    draining_pods: int
    """Registered pods of either role that drain."""
    starting_pods: int
    """Pod processes started and not yet registered (loading the model)."""
    gpus_used: int
    """Distinct GPUs held by the cluster's pod processes: running, starting, and draining ones until they exit."""
    prefill_queued_tokens: int
    """The active prefill pods' prompt tokens not yet computed (what the planner turns into queue seconds)."""
    decode_step_ms: float
    """The active decode pods' mean time per step (what the planner holds against the TPOT SLO)."""


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    end_s: float
    """When the request's client saw it end (completed or failed)."""
    record: RequestRecord


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float
    tpot_s: float
    attainment: float
    """The target fraction of requests meeting both."""


def _completed(record: RequestRecord) -> bool:
    return record.error is None and bool(record.timing.token_times)


def _figures(records: Sequence[RequestRecord], slo: Slo) -> dict[str, Any]:
    """Count, failures, TTFT and TPOT p90 (ms; NaN without a value) and SLO attainment of `records`."""
    done = [r.timing for r in records if _completed(r)]
    tpots = [t for timing in done if (t := timing.tpot) is not None]
    return {
        "finished": len(records),
        "failed": len(records) - len(done),
        "ttft_ms_p90": percentile([t.ttft for t in done], 90) * 1000,
        "tpot_ms_p90": percentile(tpots, 90) * 1000,
        "slo_attainment": slo_attainment(done, len(records) - len(done), slo.ttft_s, slo.tpot_s),
    }


def timeline_rows(samples: Sequence[PodSample], finished: Sequence[FinishedRequest], slo: Slo) -> list[dict[str, Any]]:
    """One row per sample (in time order): the sample's fields, then `_figures` of the requests that ended in its
    window, then the SLO itself in ms (`slo_ttft_ms`, `slo_tpot_ms`, for the plot's reference lines)."""
    if not samples:
        return []
    times = [s.t_s for s in samples]
    windows: list[list[RequestRecord]] = [[] for _ in samples]
    for request in finished:
        windows[max(0, bisect.bisect_right(times, request.end_s) - 1)].append(request.record)
    return [
        {
            "t_s": sample.t_s,
            "prefill_pods": sample.prefill_pods,
            "decode_pods": sample.decode_pods,
            "draining_pods": sample.draining_pods,
            "starting_pods": sample.starting_pods,
            "gpus_used": sample.gpus_used,
            "prefill_queued_tokens": sample.prefill_queued_tokens,
            "decode_step_ms": sample.decode_step_ms,
            **_figures(records, slo),
            "slo_ttft_ms": slo.ttft_s * 1000,
            "slo_tpot_ms": slo.tpot_s * 1000,
        }
        for sample, records in zip(samples, windows, strict=True)
    ]


def split_changes(samples: Sequence[PodSample]) -> list[dict[str, Any]]:
    """The first sample and each one whose (prefill, decode) active pods differ from the sample before it."""
    changes: list[dict[str, Any]] = []
    for sample in samples:
        split = (sample.prefill_pods, sample.decode_pods)
        if not changes or split != (changes[-1]["prefill_pods"], changes[-1]["decode_pods"]):
            changes.append({"t_s": sample.t_s, "prefill_pods": split[0], "decode_pods": split[1]})
    return changes


def final_part(
    samples: Sequence[PodSample],
    finished: Sequence[FinishedRequest],
    load_start: float,
    span_s: float,
    fraction: float,
    slo: Slo,
) -> dict[str, Any]:
    """The last `fraction` of the `span_s`-second arrival span: `_figures` of the requests sent in it, the rate they
    were offered at, the goodput (requests meeting the SLO per second of it, and per GPU used), whether attainment
    reached the target, and the split: the last sample's, and the most GPUs any sample from the part's start on saw."""
    begin_s = span_s * (1 - fraction)
    records = [r.record for r in finished if r.record.timing.start - load_start >= begin_s]
    figures = _figures(records, slo)
    length_s = span_s - begin_s
    met = round(figures["slo_attainment"] * len(records)) if records else 0
    during = [s for s in samples if s.t_s >= begin_s] or list(samples[-1:])
    gpus = max((s.gpus_used for s in during), default=0)
    goodput = met / length_s if length_s > 0 else math.nan
    last = samples[-1] if samples else None
    return {
        "from_s": begin_s,
        "to_s": span_s,
        **figures,
        "offered_req_per_s": len(records) / length_s if length_s > 0 else math.nan,
        "goodput_req_per_s": goodput,
        "gpus_used": gpus,
        "goodput_req_per_s_per_gpu": goodput / gpus if gpus else None,
        "meets_slo": figures["slo_attainment"] >= slo.attainment,
        "split": None if last is None else f"{last.prefill_pods}:{last.decode_pods}",
    }
