"""The offline benchmark on a tiny random-weight shape (CPU): figures present and token counts exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reporting.limits import decode_bytes_per_step
from bench.reporting.stats import RequestTiming, RunStats, percentile
from bench.workloads import make_workload
from cli.main import main as pdserve_main
from engine.llm import LLM


def test_percentile_interpolates() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([5.0], 90) == 5.0


def test_timing_figures() -> None:
    timing = RequestTiming(start=0.0, token_times=[0.5, 0.7, 1.0])
    assert (timing.ttft, timing.e2e, timing.tpot) == (0.5, 1.0, 0.25)
    assert timing.itls == pytest.approx([0.2, 0.3])
    summary = RunStats([timing], duration_s=2.0).summary()
    assert summary["output_tok_per_s"] == 1.5
    assert summary["ttft_ms_p50"] == 500.0


def test_workloads_follow_the_spec() -> None:
    w3 = make_workload("w3", vocab_size=1000, num_prompts=256, input_len=None, output_len=None)
    assert len(w3.requests) == 256 and not w3.sequential
    assert all(100 <= len(r.prompt_token_ids) <= 1024 and 100 <= r.max_tokens <= 1024 for r in w3.requests)
    assert make_workload("w3", 1000, 256, None, None).requests == w3.requests  # seed 0: same workload every time
    w1 = make_workload("w1", vocab_size=1000, num_prompts=2, input_len=None, output_len=None)
    assert w1.sequential and [(len(r.prompt_token_ids), r.max_tokens) for r in w1.requests] == [(128, 512)] * 2


def test_bench_cli_on_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "w4.json"
    args = [
        "bench",
        "--workload",
        "w4",
        "--model-shape",
        "tiny-qwen3",
        "--num-prompts",
        "4",
        "--input-len",
        "20",
        "--output-len",
        "6",
        "--num-blocks",
        "64",
        "--baseline",
        "transformers",
        "--json",
        str(out),
    ]
    assert pdserve_main(args) == 0
    result = json.loads(out.read_text())
    assert result["engine"]["requests"] == 4
    assert result["engine"]["output_tok_per_s"] * result["engine"]["duration_s"] == pytest.approx(24)
    assert result["transformers"]["output_tok_per_s"] > 0
    assert result["limits"] == {}  # no GPU: no physical limits to compare against


def test_every_workload_dispatches_to_the_module_that_runs_it() -> None:
    from bench.__main__ import WORKLOAD_MODULES
    from bench.offline import cli as offline_cli
    from bench.online import cli as online

    assert {w for w, m in WORKLOAD_MODULES.items() if m == "bench.offline.cli"} == set(offline_cli.WORKLOADS)
    assert {w for w, m in WORKLOAD_MODULES.items() if m == "bench.online.cli"} == set(online.WORKLOADS)
    assert WORKLOAD_MODULES["w6"] == "bench.kv_transfer.w6"


def test_decode_bytes_count_the_embedding_table_only_while_the_lm_head_reads_it(smollm2_path: Path) -> None:
    def step_bytes(quantize_lm_head: bool) -> int:
        llm = LLM(str(smollm2_path), quantization="int8", quantize_lm_head=quantize_lm_head, num_blocks=16)
        return decode_bytes_per_step(llm.engine.runner.model, kv_bytes_per_token=10, context_len=3)

    vocab, hidden = 49152, 576
    # the tied float32 table (read as the lm_head) gives way to an int8 head with a float32 scale per row
    assert step_bytes(True) - step_bytes(False) == vocab * hidden * 1 + vocab * 4 - vocab * hidden * 4
