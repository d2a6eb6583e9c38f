"""Latency and throughput figures of one benchmark run."""

from __future__ import annotations

from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True)
class RequestTiming:
    start: float
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.start

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        n = len(self.token_times) - 1
        return (self.token_times[-1] - self.token_times[0]) / n if n > 0 else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


@dataclass(slots=True)
class RunStats:
    timings: list[RequestTiming]
    duration_s: float

    def summary(self) -> dict[str, float]:
        ttfts = [t.ttft for t in self.timings]
        tpots = [v for t in self.timings if (v := t.tpot) is not None]
        itls = [v for t in self.timings for v in t.itls]
        e2es = [t.e2e for t in self.timings]
        out: dict[str, float] = {
            "requests": len(self.timings),
            "duration_s": self.duration_s,
            "req_per_s": len(self.timings) / self.duration_s,
            "output_tok_per_s": sum(len(t.token_times) for t in self.timings) / self.duration_s,
        }
        for name, values in (("ttft_ms", ttfts), ("tpot_ms", tpots), ("itl_ms", itls), ("e2e_ms", e2es)):
            out |= percentiles_ms(name, values)
        return out


def percentiles_ms(name: str, values_s: list[float]) -> dict[str, float]:
    """`{name}_p50`, `_p90`, `_p99` of durations given in seconds, in milliseconds."""
    return {f"{name}_p{q}": percentile(values_s, q) * 1000 for q in (50, 90, 99)}


def slo_attainment(timings: list[RequestTiming], num_failed: int, ttft_slo_s: float, tpot_slo_s: float) -> float:
    """Fraction of requests whose TTFT and TPOT (when it has one) both meet the SLO; failed requests miss it."""
    met = sum(t.ttft <= ttft_slo_s and (t.tpot is None or t.tpot <= tpot_slo_s) for t in timings)
    total = len(timings) + num_failed
    return met / total if total else float("nan")


def max_rate_meeting(rates: list[float], attainments: list[float], target: float) -> dict[str, float | None]:
    """Goodput of a rate sweep (rates ascending): the highest swept rate whose attainment >= target, and the
    rate where attainment crosses the target, linearly interpolated between the last passing and the next
    failing rate (the passing rate itself when no rate failed after it). None when no rate passed."""
    passing = [i for i, a in enumerate(attainments) if a >= target]
    if not passing:
        return {"max_rate": None, "interpolated_rate": None}
    last = passing[-1]
    crossing = rates[last]
    if last + 1 < len(rates):
        a0, a1 = attainments[last], attainments[last + 1]
        crossing += (rates[last + 1] - rates[last]) * (a0 - target) / (a0 - a1)
    return {"max_rate": rates[last], "interpolated_rate": crossing}
