"""W12 autoscale split (bench.online.autoscale_split): its pure pieces with exact values (the timeline's windows and
their p90s, the final part's figures, the split's changes, the files and the plot), then the workload end to end on
CPU with the tiny random-weight shape (soak): the autoscaler starts a second prefill pod on the third GPU.

Timing figures on a shared CPU are noise: the end-to-end test checks counts, splits and files, never latencies.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import pytest

from bench.online.autoscale_split import autoscaler_config, parse_split
from bench.online.cli import add_arguments, run
from bench.online.load_driver import RequestRecord
from bench.online.split_output import write_outputs
from bench.online.split_timeline import FinishedRequest, PodSample, Slo, final_part, split_changes, timeline_rows
from bench.reporting.stats import RequestTiming
from bench.reporting.timeline_svg import Series, panel
from common.errors import InvalidArgumentError

SLO = Slo(ttft_s=0.5, tpot_s=0.3, attainment=0.9)
SAMPLES = [
    PodSample(0.0, 1, 1, 0, 0, 2, 0, 0.0),
    PodSample(5.0, 1, 1, 0, 1, 3, 8192, 12.5),
    PodSample(10.0, 2, 2, 0, 0, 4, 1024, 10.0),
    PodSample(15.0, 2, 2, 0, 0, 4, 0, 0.0),
]


def request(end_s: float, start: float, token_times: list[float], error: str | None = None) -> FinishedRequest:
    return FinishedRequest(end_s, RequestRecord(RequestTiming(start, token_times), error=error))


FINISHED = [
    request(1.0, 0.0, [0.5, 0.75, 1.0]),  # TTFT 0.5, TPOT 0.25: meets
    request(4.0, 1.0, [1.25, 1.75, 2.25]),  # TTFT 0.25, TPOT 0.5: misses
    request(5.0, 2.0, [2.5, 3.0]),  # ends on sample 1: its window; TTFT 0.5, TPOT 0.5: misses
    request(6.0, 5.5, [], error="UNAVAILABLE: no decode pod"),
    request(7.0, 5.0, [5.125]),  # TTFT 0.125, one token: meets
    request(12.0, 9.0, [10.0, 10.25]),  # TTFT 1.0: misses
]


def test_each_window_holds_the_requests_that_ended_in_it_and_their_p90() -> None:
    rows = timeline_rows(SAMPLES, FINISHED, SLO)
    picked = [
        (r["t_s"], r["finished"], r["failed"], r["ttft_ms_p90"], r["tpot_ms_p90"], r["slo_attainment"]) for r in rows
    ]
    assert picked[0] == (0.0, 2, 0, pytest.approx(475.0), pytest.approx(475.0), 0.5)
    # TTFT p90 of [0.125, 0.5]: 0.125 + 0.9 * 0.375; TPOT of the two-token request only.
    assert picked[1] == (5.0, 3, 1, pytest.approx(462.5), 500.0, pytest.approx(1 / 3))
    assert picked[2] == (10.0, 1, 0, 1000.0, 250.0, 0.0)
    assert picked[3][:3] == (15.0, 0, 0) and all(math.isnan(v) for v in picked[3][3:])
    assert rows[1] | {"ttft_ms_p90": 0, "slo_attainment": 0} == {
        "t_s": 5.0,
        "prefill_pods": 1,
        "decode_pods": 1,
        "draining_pods": 0,
        "starting_pods": 1,
        "gpus_used": 3,
        "prefill_queued_tokens": 8192,
        "decode_step_ms": 12.5,
        "finished": 3,
        "failed": 1,
        "ttft_ms_p90": 0,
        "tpot_ms_p90": 500.0,
        "slo_attainment": 0,
        "slo_ttft_ms": 500.0,
        "slo_tpot_ms": 300.0,
    }


def test_the_final_part_counts_the_requests_sent_in_it_and_the_gpus_held_meanwhile() -> None:
    final = final_part(SAMPLES, FINISHED, load_start=0.0, span_s=12.0, fraction=0.75, slo=SLO)
    # Sent from 3 s on: the failed one, the one-token one (meets) and the last one (misses).
    assert final == {
        "from_s": 3.0,
        "to_s": 12.0,
        "finished": 3,
        "failed": 1,
        "ttft_ms_p90": pytest.approx(912.5),
        "tpot_ms_p90": 250.0,
        "slo_attainment": pytest.approx(1 / 3),
        "offered_req_per_s": pytest.approx(1 / 3),
        "goodput_req_per_s": pytest.approx(1 / 9),
        "gpus_used": 4,
        "goodput_req_per_s_per_gpu": pytest.approx(1 / 36),
        "meets_slo": False,
        "split": "2:2",
    }
    assert split_changes(SAMPLES) == [
        {"t_s": 0.0, "prefill_pods": 1, "decode_pods": 1},
        {"t_s": 10.0, "prefill_pods": 2, "decode_pods": 2},
    ]


def test_split_and_autoscaler_settings_come_from_the_flags() -> None:
    assert parse_split("2:2") == (2, 2) and parse_split("3:1") == (3, 1) and parse_split(None) is None
    for bad in ("2", "0:2", "a:1", "1:2:3"):
        with pytest.raises(InvalidArgumentError, match="PREFILL:DECODE"):
            parse_split(bad)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--slo-ttft-ms", "1500", "--slo-tpot-ms", "15", "--autoscale-interval-s", "2"])
    config = autoscaler_config(args, num_gpus=4)
    assert (config.decode_tpot_slo_ms, config.prefill_queue_high_s, config.max_total_pods) == (15.0, 0.75, 4)
    assert config.autoscale_interval_s == 2.0
    given = parser.parse_args(["--slo-ttft-ms", "1500", "--prefill-queue-high-s", "0.5", "--max-total-pods", "3"])
    config = autoscaler_config(given, num_gpus=4)
    assert (config.prefill_queue_high_s, config.max_total_pods, config.decode_tpot_slo_ms) == (0.5, 3, 50.0)


def test_a_window_without_requests_is_a_gap_in_its_line() -> None:
    rows = [{"t_s": 0.0, "v": 1.0}, {"t_s": 5.0, "v": math.nan}, {"t_s": 10.0, "v": 2.0}]
    svg = panel(rows, "p90", [Series("v", "v", "#000000")], 50, 40)
    # y_max 2 (top 2.3) over 150 px at y 40..190; t 0..10 s over 400 px from x 50; 1 holds until the gap at 5 s.
    assert svg.count("<polyline") == 2
    assert 'points="50.0,124.8 250.0,124.8"' in svg and 'points="450.0,59.6 450.0,59.6"' in svg


def test_the_timeline_is_written_as_csv_json_and_svg(tmp_path: Path) -> None:
    rows = timeline_rows(SAMPLES, FINISHED, SLO)
    paths = write_outputs(tmp_path / "out", "autoscale", {"mode": "autoscale", "timeline": rows}, "a note")
    with open(paths["csv"], newline="") as source:
        lines = list(csv.reader(source))
    assert lines[0][:3] == ["run", "t_s", "prefill_pods"] and len(lines) == 5
    assert ",".join(lines[4]) == "autoscale,15.0,2,2,0,0,4,0,0.0,0,0,,,,500.0,300.0"
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved["mode"] == "autoscale" and saved["timeline"][3]["ttft_ms_p90"] is None
    svg = Path(paths["svg"]).read_text()
    assert svg.startswith("<svg") and "TPOT p90" in svg and "a note" in svg
    # 4 panels; every series a line but the last window's p90s (one segment each, before the gap).
    assert svg.count("<polyline") == 5 + 2 + 2 + 2


# NOTE: a soak case: 1-10 min on the 2 shared cores, most of it the pods' start-up (1-2 min each there under the load of
# other tests).
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_w12_autoscaler_moves_the_split_and_every_request_ends(tmp_path: Path) -> None:
    """The tiny random-weight shape on 3 GPU ids (ignored on a CPU host), 1 prefill + 1 decode pod, and an autoscaler
    whose --min-prefill 2 asks at once for a second prefill pod: it starts on the third GPU, serving before the 60 s
    of load end (the load-driven policy is autoscaler/planner.py's, tested there); no request fails, and the timeline,
    its files and the final figures say so. A heartbeat of 1 s keeps every pod in the registry on a loaded machine."""
    flags = [
        "--workload",
        "w12",
        "--model-shape",
        "tiny-qwen3",
        "--gpus",
        "0,1,2",
        "--pod-arg",
        "--heartbeat-s 1 --num-blocks 256",
        "--log-dir",
        str(tmp_path / "logs"),
        "--out-dir",
        str(tmp_path / "out"),
        "--no-progress",
        "--input-len",
        "48",
        "--output-len",
        "4",
        "--warmup-prompts",
        "1",
        "--request-rate",
        "1",
        "--duration-s",
        "60",
        "--sample-interval-s",
        "1",
        "--slo-ttft-ms",
        "600000",
        "--slo-tpot-ms",
        "600000",
        "--autoscale-interval-s",
        "0.5",
        "--min-prefill",
        "2",
    ]
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload")
    add_arguments(parser)
    result = run(parser.parse_args(flags))
    assert result["mode"] == "autoscale" and result["autoscaler"]["max_total_pods"] == 3
    assert result["interrupted"] is False
    assert result["whole_run"]["failed"] == 0 and result["whole_run"]["requests"] == 60
    assert result["final"]["split"] == "2:1" and result["final"]["gpus_used"] == 3
    assert result["final"]["failed"] == 0 and result["final"]["slo_attainment"] == 1.0
    assert [(c["prefill_pods"], c["decode_pods"]) for c in result["split_changes"]] == [(1, 1), (2, 1)]
    timeline = list(csv.DictReader(Path(result["files"]["csv"]).read_text().splitlines()))
    assert sum(int(row["finished"]) for row in timeline) == 60
    assert max(int(row["gpus_used"]) for row in timeline) == 3
    assert Path(result["files"]["svg"]).read_text().startswith("<svg")
    assert json.loads(Path(result["files"]["json"]).read_text())["final"]["split"] == "2:1"
