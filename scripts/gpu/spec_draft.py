"""Draft-model speculation on the GPU (issue 31, part 2): a Qwen3-0.6B-shape draft for a Qwen3-8B-shape target, random
bf16 weights, CUDA graphs on, batch 1, 128 prompt + 256 output tokens, EOS ignored.

1. off: the target alone, batch-1 TPOT (its greedy output is the first recording).
2. draft_replay at each acceptance (the fraction of proposals left uncorrupted) and k: the draft model runs every
   step (its full cost) but proposes replay's recorded tokens, so acceptance is controlled as for n-gram; each level
   replays the speculating engine's own output until it reproduces it (engine.spec.replay.replay_until_reproduced),
   the last round timed. Per row: TPOT on/off, the measured acceptance, and the draft's cost: wall time of the draft
   rounds (`Speculator.begin_step`, which waits for the draft's last step) per round and per proposed token. Rows
   with `min_acceptance` 0 keep k fixed; the others keep the engine's adaptive length (defaults).
3. the decode pod's draft prefill: a 2048-token prompt's first draft round (the draft prefills the prompt itself)
   against the target's own prefill of it (TTFT).

Usage: python3 scripts/gpu/spec_draft.py OUT.json
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.draft_speculator import DraftSpeculator
from engine.spec.replay import ReplayProposer, replay_until_reproduced

SHAPE = {"model": "shape:qwen3-8b", "load_format": "dummy", "dtype": "bfloat16", "num_blocks": 2048}
DRAFT = "shape:qwen3-0.6b"
GROUPS = [((4, 0.0), (0.8, 1.0, 0.6)), ((4, None), (0.8, 0.0))]
"""One engine per (k, min_acceptance; None: the default adaptive switch), timed at each acceptance in turn."""
MAX_ROUNDS = 16
OUTPUT_LEN = 256
rng = random.Random(0)
PROMPT = [rng.randrange(1000, 100000) for _ in range(128)]
LONG_PROMPT = [rng.randrange(1000, 100000) for _ in range(2048)]


class DraftTimer:
    """Wall time of each draft round (begin_step calls that proposed)."""

    def __init__(self, speculator: DraftSpeculator) -> None:
        self.round_ms: list[float] = []
        begin_step = speculator.begin_step

        def timed(running: list[Any]) -> None:
            start = time.perf_counter()
            begin_step(running)
            if speculator._planned:
                self.round_ms.append((time.perf_counter() - start) * 1e3)

        speculator.begin_step = timed  # type: ignore[method-assign]


def decode(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float, float]:
    """Greedy outputs, TPOT ms after the first token, TTFT ms."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    start, first = time.perf_counter(), None
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.req_id] += output.new_token_ids
        if first is None and any(tokens.values()):
            first = time.perf_counter()
    torch.cuda.synchronize()
    assert first is not None
    tpot = (time.perf_counter() - first) / max(max_tokens - 1, 1) * 1e3
    return [tokens[str(i)] for i in range(len(prompts))], tpot, (first - start) * 1e3


def engine_with(spec: dict[str, Any] | None) -> LLMEngine:
    engine = LLMEngine(engine_config(**SHAPE, speculative_config=spec))  # type: ignore[arg-type]
    decode(engine, [PROMPT], 32)  # warm-up, and the prompt in the prefix cache
    return engine


def free_memory() -> None:
    """Once the caller dropped its engine: its memory back before the next one is built."""
    gc.collect()
    torch.cuda.empty_cache()


def draft_engine(k: int, min_acceptance: float | None) -> tuple[LLMEngine, DraftTimer]:
    spec: dict[str, Any] = {"method": "draft_replay", "model": DRAFT, "num_speculative_tokens": k}
    spec |= {} if min_acceptance is None else {"min_acceptance": min_acceptance}
    engine = engine_with(spec)
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator) and isinstance(speculator.proposer, ReplayProposer)
    return engine, DraftTimer(speculator)


def spec_row(engine: LLMEngine, timer: DraftTimer, acceptance: float, recording: list[int], tpot_off: float) -> dict:
    """The row of one acceptance level (module docstring), and the recording it ended on."""
    proposer = engine.speculator.proposer if engine.speculator is not None else None
    assert isinstance(proposer, ReplayProposer)
    proposer.corruption = 1.0 - acceptance

    def replayed() -> tuple[list[list[int]], tuple[list[int], dict[str, Any]]]:
        before, timer.round_ms = engine.spec_stats, []
        (tokens,), tpot, _ = decode(engine, [PROMPT], OUTPUT_LEN)
        after = engine.spec_stats
        drafts, accepted = after.draft_tokens - before.draft_tokens, after.accepted_tokens - before.accepted_tokens
        rounds = timer.round_ms
        row = {
            "acceptance": acceptance,
            "tpot_ms": tpot,
            "ratio": tpot / tpot_off,
            "acceptance_rate": accepted / drafts if drafts else 0.0,
            "draft_tokens": drafts,
            "draft_rounds": len(rounds),
            "draft_round_ms_p50": statistics.median(rounds) if rounds else 0.0,
            "draft_ms_per_token": sum(rounds) / drafts if drafts else 0.0,
        }
        return [tokens], (tokens, row)

    (tokens, row), num_rounds, same = replay_until_reproduced(
        engine.set_replay_recordings, [PROMPT], [recording], replayed, MAX_ROUNDS
    )
    return row | {"rounds": num_rounds, "same_tokens": same, "recording": tokens}


def draft_prefill(engine: LLMEngine, timer: DraftTimer) -> dict[str, float]:
    """The first draft round of a 2048-token prompt (the draft's own prefill; no recording: the draft's own
    proposals) against the target's prefill of it."""
    timer.round_ms = []
    _, _, ttft = decode(engine, [LONG_PROMPT], 8)
    first, *rest = timer.round_ms
    return {"target_ttft_ms": ttft, "first_round_ms": first, "later_round_ms_p50": statistics.median(rest)}


def main(path: str) -> None:
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "target": SHAPE["model"], "draft": DRAFT}
    off = engine_with(None)
    (recording,), tpot_off, _ = decode(off, [PROMPT], OUTPUT_LEN)
    del off
    free_memory()
    results["tpot_off_ms"] = tpot_off
    print(f"off: batch-1 TPOT {tpot_off:.2f} ms", flush=True)
    results["rows"] = []
    for (k, min_acceptance), acceptances in GROUPS:
        engine, timer = draft_engine(k, min_acceptance)
        level_recording = recording
        for acceptance in acceptances:
            row = spec_row(engine, timer, acceptance, level_recording, tpot_off)
            level_recording = row.pop("recording")
            results["rows"].append({"k": k, "min_acceptance": min_acceptance} | row)
            print(json.dumps(results["rows"][-1]), flush=True)
            Path(path).write_text(json.dumps(results, indent=2))
        if min_acceptance is None:
            results["draft_prefill"] = draft_prefill(engine, timer)
            print(f"draft prefill: {json.dumps(results['draft_prefill'])}", flush=True)
        del engine, timer
        free_memory()
    target = results["rows"][0]
    results["checks"] = {
        "acceptance 0.8, k=4 (fixed): batch-1 TPOT ratio <= 0.5": target["ratio"] <= 0.5,
        "every row: same_tokens": all(r["same_tokens"] for r in results["rows"]),
    }
    for name, ok in results["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)
    Path(path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
