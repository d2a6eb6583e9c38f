"""W10 of docs/workloads.md: decode with speculation on vs off.

Two modes:
- controlled acceptance (default; GPU, e.g. `--model-shape qwen3-8b`): random prompts decoded greedily without
  speculation at each batch size (the off figures, and each batch's first recording), then with the replay proposer
  at each `--spec-k` and, per batch size, each `--spec-acceptance` (the fraction of proposed tokens left
  uncorrupted) in turn. Each level replays the speculating engine's own greedy output until it reproduces it
  (`engine.spec.replay.replay_until_reproduced`: in bf16 a verify step rounds differently from a one-token step, so
  the output without speculation stops being a recording the engine follows), starting from the previous level's
  recording; the last round is the one timed. One row per batch size and acceptance: TPOT off and on, their ratio,
  output tok/s, the engine's SpecStats, the rounds, and whether the timed round's tokens were its recording. The
  engine's own adaptive switch stays on (its defaults), as a user would run it.
- real acceptance (`--spec-tasks DIR`; CPU): n-gram speculation on a real model over copy-heavy task sets
  (bench.offline.spec_study), with the implied batch-1 speedup when `--step-ms DECODE,VERIFY` gives the GPU's step
  times.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.offline.spec_study import decode_greedy, run_study
from bench.reporting.stats import RequestTiming, RunStats
from bench.workloads import fixed_requests
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX
from engine.spec.replay import ReplayProposer, replay_until_reproduced
from engine.spec.stats import SpecStats

WORKLOADS = ("w10",)
Batches = dict[int, list[list[int]]]
"""Batch size -> one token id list per request (prompts, or outputs)."""
Figures = dict[int, dict[str, float]]
MAX_REPLAY_ROUNDS = 16
"""Rounds of replay per batch size and acceptance, at most (scripts/gpu/spec.sh on an H100, Qwen3-8B shape, bf16,
batch 1, 256 output tokens: up to 9)."""


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", default=None, help="model folder or alias (real weights); default smollm2-135m")
    model.add_argument("--model-shape", default=None, help="random weights of a named shape, e.g. qwen3-8b")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 16], help="comma-separated (default 1,16)")
    p.add_argument("--spec-acceptance", type=_floats, default=[1.0, 0.5, 0.0], help="replay: fractions uncorrupted")
    p.add_argument("--spec-k", type=_ints, default=[4], help="tokens proposed per step; comma-separated")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=None, help="default: 256 (controlled), 192 (--spec-tasks)")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--spec-tasks", type=Path, default=None, help="real acceptance over these task files (*.txt)")
    p.add_argument("--prompt-lookup", type=_ints, default=[1, 4], help="--spec-tasks: MIN,MAX n-gram lengths")
    p.add_argument("--step-ms", type=_floats, default=None, help="--spec-tasks: GPU DECODE,VERIFY step times (ms)")
    p.add_argument("--check-engine", action="store_true", help="--spec-tasks: also run the engine with speculation")


def _validate(args: argparse.Namespace) -> None:
    if any(not 0.0 <= a <= 1.0 for a in args.spec_acceptance):
        raise SystemExit(f"--spec-acceptance: fractions in [0, 1], got {args.spec_acceptance}")
    if any(k < 1 for k in args.spec_k) or any(b < 1 for b in args.batch_sizes):
        raise SystemExit("--spec-k, --batch-sizes: every value must be >= 1")
    if len(args.prompt_lookup) != 2 or (args.step_ms is not None and len(args.step_ms) != 2):
        raise SystemExit("--prompt-lookup: MIN,MAX; --step-ms: DECODE,VERIFY")


def _engine(args: argparse.Namespace, speculative_config: dict[str, Any] | None = None) -> LLMEngine:
    kwargs: dict[str, Any] = {"dtype": args.dtype, "enforce_eager": args.enforce_eager}
    kwargs |= {"num_blocks": args.num_blocks} if args.num_blocks is not None else {}
    kwargs |= {"speculative_config": speculative_config} if speculative_config else {}
    if args.model_shape:
        return LLMEngine(engine_config(SHAPE_PREFIX + args.model_shape, load_format="dummy", **kwargs))
    return LLMEngine(engine_config(args.model or "smollm2-135m", **kwargs))


def _timed_decode(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], RunStats]:
    """The prompts decoded greedily in one batch: the outputs, and their timings."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs: dict[str, list[int]] = {f"timed{i}": [] for i in range(len(prompts))}
    start = time.perf_counter()
    timings = {req_id: RequestTiming(start) for req_id in outputs}
    for req_id, prompt in zip(outputs, prompts, strict=True):
        engine.add_request(req_id, prompt, params)
    while engine.has_unfinished_requests():
        step_outputs = engine.step()
        now = time.perf_counter()
        for out in step_outputs:
            outputs[out.req_id] += out.new_token_ids
            timings[out.req_id].token_times.extend(now for _ in out.new_token_ids)
    return list(outputs.values()), RunStats(list(timings.values()), time.perf_counter() - start)


def _warm_up(engine: LLMEngine, prompts: list[list[int]]) -> None:
    """A few steps of the same batch first, so the timed run pays no compilation or allocation."""
    decode_greedy(engine, prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))


def _set_acceptance(engine: LLMEngine, acceptance: float) -> None:
    proposer = None if engine.speculator is None else engine.speculator.proposer
    if not isinstance(proposer, ReplayProposer):
        raise TypeError("the engine must speculate with the replay proposer")
    # NOTE: one engine serves every acceptance level (building a second 8B engine costs more than the runs).
    proposer.corruption = 1.0 - acceptance


def _run_off(args: argparse.Namespace, output_len: int, result: dict[str, Any]) -> tuple[Batches, Batches, Figures]:
    """Each batch size's random prompts decoded without speculation: the prompts, their greedy outputs (to replay)
    and the figures. Fills `result` with what the engine runs on; the engine is gone on return, so the next one
    has the memory."""
    off = _engine(args)
    prompts = {
        b: [s.prompt_token_ids for s in fixed_requests(off.info.vocab_size, b, args.input_len, output_len, seed=b)]
        for b in args.batch_sizes
    }
    result |= {"device": off.info.device, "dtype": off.info.dtype, "model": off.info.model_id}
    result["cuda_graphs"] = off.runner.cuda_graphs is not None
    if off.runner.device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name()
    recorded: Batches = {}
    figures: Figures = {}
    for batch, batch_prompts in prompts.items():
        _warm_up(off, batch_prompts)
        recorded[batch], run = _timed_decode(off, batch_prompts, output_len)
        figures[batch] = run.summary()
    del off
    gc.collect()
    torch.cuda.empty_cache()
    return prompts, recorded, figures


def _controlled(args: argparse.Namespace) -> dict[str, Any]:
    """The controlled-acceptance rows (module docstring), for every k, batch size and acceptance."""
    output_len = args.output_len or 256
    result: dict[str, Any] = {"workload": f"w10 spec {args.input_len}/{output_len}"}
    prompts, recorded_off, off_figures = _run_off(args, output_len, result)
    result["max_replay_rounds"] = MAX_REPLAY_ROUNDS
    rows = []
    for k in args.spec_k:
        on = _engine(args, {"method": "replay", "num_speculative_tokens": k})
        for batch, batch_prompts in prompts.items():
            recording = recorded_off[batch]
            for acceptance in args.spec_acceptance:
                _set_acceptance(on, acceptance)
                on.set_replay_recordings(dict(zip(map(tuple, batch_prompts), recording, strict=True)))
                _warm_up(on, batch_prompts)
                replayed = decode_replayed(on, batch_prompts, recording, output_len)
                recording = replayed.outputs
                rows.append(_row(batch, k, acceptance, off_figures[batch], replayed))
                rows[-1] |= _step_times(rows[-1], batch * (output_len - 1))
        del on
        gc.collect()
        torch.cuda.empty_cache()
    return result | {"rows": rows}


@dataclass(frozen=True, slots=True)
class Replayed:
    """The timed (last) round of a replay: its outputs, run figures and speculation counts, the rounds it took,
    and whether its outputs equal the recording it replayed."""

    outputs: list[list[int]]
    figures: dict[str, float]
    stats: SpecStats
    rounds: int
    same_tokens: bool


def decode_replayed(
    engine: LLMEngine, prompts: list[list[int]], recording: list[list[int]], max_tokens: int
) -> Replayed:
    """The prompts decoded with the replay proposer until their outputs reproduce the recording they replayed,
    from `recording` on (engine.spec.replay.replay_until_reproduced)."""

    def decode() -> tuple[list[list[int]], tuple[list[list[int]], dict[str, float], SpecStats]]:
        before = engine.spec_stats
        outputs, run = _timed_decode(engine, prompts, max_tokens)
        after = engine.spec_stats
        stats = SpecStats(
            after.draft_tokens - before.draft_tokens,
            after.accepted_tokens - before.accepted_tokens,
            after.verify_steps - before.verify_steps,
        )
        return outputs, (outputs, run.summary(), stats)

    (outputs, figures, stats), rounds, same = replay_until_reproduced(
        engine.set_replay_recordings, prompts, recording, decode, MAX_REPLAY_ROUNDS
    )
    return Replayed(outputs, figures, stats, rounds, same)


def _row(batch: int, k: int, acceptance: float, off: dict[str, float], replayed: Replayed) -> dict[str, Any]:
    on, stats = replayed.figures, replayed.stats
    return {
        "batch": batch,
        "k": k,
        "acceptance": acceptance,
        "tpot_off_ms": off["tpot_ms_p50"],
        "tpot_on_ms": on["tpot_ms_p50"],
        "tpot_ratio": on["tpot_ms_p50"] / off["tpot_ms_p50"],
        "tok_s_off": off["output_tok_per_s"],
        "tok_s_on": on["output_tok_per_s"],
        "throughput_ratio": on["output_tok_per_s"] / off["output_tok_per_s"],
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "verify_steps": stats.verify_steps,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "rounds": replayed.rounds,
        "same_tokens": replayed.same_tokens,
    }


def _step_times(row: dict[str, Any], num_decoded: int) -> dict[str, float]:
    """Tokens per decode step (each step emits accepted + 1 per request) and the time of one step with
    speculation: the verify-step time that `--spec-tasks --step-ms` takes, from the acceptance-1.0 row."""
    tokens_per_step = num_decoded / (num_decoded - row["accepted_tokens"])
    return {"tokens_per_step": tokens_per_step, "step_on_ms": row["tpot_on_ms"] * tokens_per_step}


def run(args: argparse.Namespace) -> dict[str, Any]:
    _validate(args)
    if args.spec_tasks is None:
        return _controlled(args)
    result = run_study(
        args.model or "smollm2-135m",
        args.spec_tasks,
        args.spec_k,
        args.output_len or 192,
        (args.prompt_lookup[0], args.prompt_lookup[1]),
        None if args.step_ms is None else (args.step_ms[0], args.step_ms[1]),
        args.check_engine,
    )
    return {"workload": "w10 spec real acceptance"} | result
