"""The online benchmarks (bench.online.cli): their pure pieces exactly, then every workload end to end on
CPU with tiny counts, against one real cluster for the module (Redis, 1 prefill + 1 decode pod, the router;
smollm2-135m) that the benchmark's own code starts; one more run starts a cluster of its own for a random-weight
shape, whose router detokenizes with the synthetic tokenizer.

Timing figures on a shared CPU are noise: the end-to-end tests check structure, counts and cache hits, never
which of two latencies is lower.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.online.arrivals import parse_rates, poisson_arrivals
from bench.online.cli import WORKLOADS, add_arguments, run, with_defaults
from bench.online.cluster_target import model_choice, serving, write_synthetic_tokenizer
from bench.online.process_cpu import CpuSnapshot
from bench.online.router_overhead import ClientJob, split_job
from bench.reporting.stats import RequestTiming, max_rate_meeting, slo_attainment
from bench.workloads import RequestSpec, mixed_requests, shared_prefix_requests
from common.detokenizer import IncrementalDetokenizer
from router.tokenizer.tokenizer_pool import load_tokenizer

POD_FLAGS = "--heartbeat-s 0.2 --num-blocks 512"
TINY = ["--input-len", "16", "--output-len", "2", "--warmup-prompts", "1"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_poisson_arrivals_are_seeded_and_at_the_rate() -> None:
    arrivals = poisson_arrivals(4.0, 4000, seed="s")
    assert arrivals == poisson_arrivals(4.0, 4000, seed="s") != poisson_arrivals(4.0, 4000, seed="t")
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert arrivals[-1] / len(arrivals) == pytest.approx(0.25, rel=0.05)
    assert poisson_arrivals(float("inf"), 3, seed=0) == [0.0, 0.0, 0.0]
    assert parse_rates("2, 4,inf") == [2.0, 4.0, float("inf")]
    with pytest.raises(ValueError):
        parse_rates("2,0")


def test_online_workloads_follow_the_spec() -> None:
    w5 = mixed_requests(vocab_size=1000, num_requests=200, mean_input_len=200, mean_output_len=180, seed="a")
    assert all(100 <= len(r.prompt_token_ids) <= 300 and 90 <= r.max_tokens <= 270 for r in w5)
    assert 190 < sum(len(r.prompt_token_ids) for r in w5) / len(w5) < 210
    w9 = shared_prefix_requests(1000, 3, prefix_len=32, suffix_len=5, output_len=2, seed="b")
    assert [len(r.prompt_token_ids) for r in w9] == [37] * 3
    assert w9[0].prompt_token_ids[:32] == w9[2].prompt_token_ids[:32]
    assert w9[0].prompt_token_ids[32:] != w9[1].prompt_token_ids[32:]


def test_slo_attainment_and_goodput() -> None:
    timings = [
        RequestTiming(0.0, [0.1, 0.2, 0.3]),  # TTFT 0.1, TPOT 0.1: meets
        RequestTiming(0.0, [0.5, 0.6]),  # TTFT too long
        RequestTiming(0.0, [0.1, 0.5]),  # TPOT too long
        RequestTiming(0.0, [0.2]),  # one token: no TPOT, meets
    ]
    assert slo_attainment(timings, num_failed=0, ttft_slo_s=0.2, tpot_slo_s=0.2) == 0.5
    assert slo_attainment(timings, num_failed=4, ttft_slo_s=0.2, tpot_slo_s=0.2) == 0.25
    assert max_rate_meeting([1, 2, 4, 8], [1.0, 0.95, 0.85, 0.5], 0.9) == {
        "max_rate": 2,
        "interpolated_rate": pytest.approx(3.0),
    }
    assert max_rate_meeting([1, 2], [1.0, 0.9], 0.9) == {"max_rate": 2, "interpolated_rate": 2}
    assert max_rate_meeting([1, 2], [0.5, 0.1], 0.9) == {"max_rate": None, "interpolated_rate": None}


def test_synthetic_tokenizer_round_trips_every_id(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_synthetic_tokenizer(tmp_path / "tok", vocab_size=300))
    assert tokenizer.backend_tokenizer.encode("t0 t5 t299").ids == [0, 5, 299]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, 2])
    assert [detokenizer.update([i]).text_delta for i in (7, 299)] == [" t7", " t299"]


def test_client_jobs_split_requests_and_concurrency() -> None:
    specs = tuple(RequestSpec([i], 1) for i in range(5))
    job = ClientJob(
        True,
        "a:1",
        (),
        (),
        specs,
        None,
        concurrency=3,
        num_connections=2,
        timeout_s=1.0,
        id_prefix="x",
        show_progress=True,
    )
    parts = split_job(job, 2)
    assert [[s.prompt_token_ids[0] for s in p.specs] for p in parts] == [[0, 2, 4], [1, 3]]
    assert [p.concurrency for p in parts] == [2, 1] and [p.id_prefix for p in parts] == ["x-p0", "x-p1"]
    assert split_job(replace(job, concurrency=1), 4) == [replace(job, concurrency=1, id_prefix="x-p0")]
    assert CpuSnapshot.take().tree(os.getpid()) > 0


@pytest.fixture(scope="module")
def cluster_flags(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Flags that point a workload at the module's cluster (started by the benchmark's own `serving`)."""
    log_dir = tmp_path_factory.mktemp("online-bench-logs")
    args = with_defaults(parse(["--workload", "w5", "--pod-arg", POD_FLAGS, "--log-dir", str(log_dir)]))
    with serving(args, model_choice(args)) as cluster:
        assert cluster.redis_url is not None and cluster.router_pid is not None
        yield [
            "--address",
            cluster.address,
            "--redis-url",
            cluster.redis_url,
            "--router-pid",
            str(cluster.router_pid),
            "--no-progress",
            "--colocated-arg",
            "--num-blocks 256",
        ]


def run_workload(workload: str, *flags: str) -> dict[str, Any]:
    return run(parse(["--workload", workload, *flags]))


def assert_latencies(summary: dict[str, Any], num_requests: int) -> None:
    assert summary["requests"] == num_requests and summary["failed"] == 0
    for name in ("ttft", "e2e", "itl"):
        assert 0 <= summary[f"{name}_ms_p50"] <= summary[f"{name}_ms_p90"] <= summary[f"{name}_ms_p99"]
    assert summary["ttft_ms_p99"] <= summary["e2e_ms_p99"]
    assert summary["req_per_s"] == pytest.approx(num_requests / summary["duration_s"])


def test_w5_rate_sweep(cluster_flags: list[str]) -> None:
    result = run_workload("w5", *cluster_flags, *TINY, "--request-rates", "8", "--num-prompts", "4")
    (rate,) = result["rates"]
    assert rate["offered_req_per_s"] == 8.0
    assert_latencies(rate, 4)
    # NOTE: mixed lengths: prompts of 8..24 tokens, 1..3 output tokens each, every one of them produced (EOS ignored).
    output_tokens = rate["output_tok_per_s"] * rate["duration_s"]
    assert output_tokens == pytest.approx(round(output_tokens)) and 4 <= round(output_tokens) <= 12
    assert 8 <= rate["mean_prompt_tokens"] <= 24 and rate["mean_cached_tokens"] == 0
    assert rate["router_ttft_ms_p50"] <= rate["ttft_ms_p50"]


def test_w7_goodput_colocated_vs_disaggregated(cluster_flags: list[str]) -> None:
    slo = ["--slo-ttft-ms", "600000", "--slo-tpot-ms", "600000"]
    result = run_workload("w7", *cluster_flags, *TINY, *slo, "--request-rates", "8,16", "--num-prompts", "2")
    for name in ("colocated", "disaggregated"):
        system = result[name]
        assert [r["offered_req_per_s"] for r in system["rates"]] == [8.0, 16.0]
        assert [r["slo_attainment"] for r in system["rates"]] == [1.0, 1.0]
        assert system["gpus"] == 1 and system["goodput_req_per_s_per_gpu"] == 16.0
        for row in system["rates"]:
            assert_latencies(row, 2)
            assert row["output_tok_per_s"] * row["duration_s"] == pytest.approx(4)
    assert result["goodput_per_gpu_ratio"] == 1.0


def test_w8_router_overhead(cluster_flags: list[str]) -> None:
    flags = ["--concurrency", "2", "--num-prompts", "6", "--client-procs", "2"]
    result = run_workload("w8", *cluster_flags, *TINY, *flags)
    (level,) = result["levels"]
    assert level["concurrency"] == 2 and not result["notes"]
    assert_latencies(level["direct"], 6)
    assert_latencies(level["router"], 6)
    assert level["direct"]["mean_prompt_tokens"] > 0 and level["router"]["mean_prompt_tokens"] > 0
    assert set(level["overhead_ms"]) == {"ttft_p50", "ttft_mean", "e2e_p50", "e2e_mean"}
    assert level["router_cpu_ms_per_request"] > 0
    assert level["streams_per_s_per_core"] == pytest.approx(1000 / level["router_cpu_ms_per_request"])
    assert 0 < level["router_cpu_cores"] <= (os.cpu_count() or 1)


def test_w9_prefix_hits(cluster_flags: list[str]) -> None:
    flags = ["--prefix-len", "64", "--num-prompts", "2"]
    result = run_workload("w9", *cluster_flags, *TINY, *flags)
    assert result["expected_cached_tokens"] == 64
    assert result["first_request"]["cached_tokens"] == 0 and result["first_request"]["ttft_ms"] > 0
    hit, miss = result["prefix_hit"], result["no_prefix_hit"]
    assert_latencies(hit, 2)
    assert_latencies(miss, 2)
    assert hit["min_cached_tokens"] == hit["max_cached_tokens"] == 64
    assert miss["max_cached_tokens"] == 0
    assert hit["mean_prompt_tokens"] == miss["mean_prompt_tokens"] == 80
    assert result["ttft_p50_speedup"] == pytest.approx(miss["ttft_ms_p50"] / hit["ttft_ms_p50"])


def test_w2online_router_vs_colocated_ttft(cluster_flags: list[str]) -> None:
    result = run_workload("w2online", *cluster_flags, *TINY, "--input-len", "32", "--num-prompts", "2")
    assert_latencies(result["colocated"], 2)
    assert_latencies(result["router"], 2)
    assert result["colocated"]["mean_prompt_tokens"] == result["router"]["mean_prompt_tokens"] == 32
    ratio = result["router"]["ttft_ms_p50"] / result["colocated"]["ttft_ms_p50"]
    assert result["ttft_ratio_p50"] == pytest.approx(ratio)
    assert result["within_target"] == (ratio <= result["target_ratio"])


@pytest.mark.slow
def test_shape_model_through_its_own_cluster(tmp_path: Path) -> None:
    """A random-weight shape on a cluster the run starts and stops: pods load dummy weights and the router
    (no tokenizer in the shape's folder) streams with the synthetic tokenizer."""
    flags = ["--model-shape", "tiny-qwen3", "--pod-arg", POD_FLAGS, "--log-dir", str(tmp_path), "--no-progress"]
    result = run_workload("w5", *flags, *TINY, "--request-rates", "8", "--num-prompts", "2")
    assert result["model"] == "shape:tiny-qwen3" and result["kv_transfer_backend"] == "tcp"
    assert_latencies(result["rates"][0], 2)
