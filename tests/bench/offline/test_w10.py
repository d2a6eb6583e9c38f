"""`pdserve bench --workload w10` on the CPU: flag parsing, the controlled-acceptance mode on a tiny random shape
(and its replay rounds from a recording the engine does not reproduce), and the real-acceptance mode on a tiny random
model with SmolLM2's tokenizer, checked against the engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.__main__ import parse_args
from bench.offline.spec_study import decode_greedy
from bench.offline.w10 import decode_replayed
from cli.main import main as pdserve_main
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine


def test_w10_flags_parse() -> None:
    args, module = parse_args(
        ["--workload", "w10", "--spec-acceptance", "1.0,0.5,0.0", "--spec-k", "2,4", "--batch-sizes", "1,16"]
    )
    assert module.__name__ == "bench.offline.w10"
    assert (args.spec_acceptance, args.spec_k, args.batch_sizes) == ([1.0, 0.5, 0.0], [2, 4], [1, 16])
    args, _ = parse_args(["--workload", "w10", "--spec-tasks", "bench/offline/spec_tasks", "--step-ms", "6.0,6.6"])
    assert (args.spec_tasks, args.step_ms, args.prompt_lookup) == (Path("bench/offline/spec_tasks"), [6.0, 6.6], [1, 4])
    with pytest.raises(SystemExit, match="spec-acceptance"):
        module.run(parse_args(["--workload", "w10", "--spec-acceptance", "1.5"])[0])


def test_w10_controlled_acceptance_on_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "w10.json"
    args = ["bench", "--workload", "w10", "--model-shape", "tiny-qwen3", "--batch-sizes", "2"]
    args += ["--spec-acceptance", "1.0,0.0", "--spec-k", "2", "--input-len", "16", "--output-len", "12"]
    assert pdserve_main([*args, "--num-blocks", "64", "--json", str(out)]) == 0
    full, none = json.loads(out.read_text())["rows"]
    assert all(row["same_tokens"] and row["rounds"] == 1 and row["batch"] == 2 for row in (full, none))
    # Per request 11 tokens after the first: steps of 2 accepted + 1 (three times), then 1 + 1 (k capped at the
    # one token left after the step's own): 7 drafts over 4 verify steps, all accepted.
    assert (full["draft_tokens"], full["accepted_tokens"], full["verify_steps"]) == (14, 14, 8)
    assert full["mean_accepted_length"] == 2.75
    assert full["tokens_per_step"] == 22 / 8 and full["step_on_ms"] == pytest.approx(full["tpot_on_ms"] * 22 / 8)
    assert none["accepted_tokens"] == 0 and none["draft_tokens"] > 0
    assert none["tpot_off_ms"] == full["tpot_off_ms"] > 0


def test_replay_rounds_from_a_recording_the_engine_does_not_reproduce() -> None:
    spec = {"method": "replay", "num_speculative_tokens": 2}
    engine = LLMEngine(engine_config("shape:tiny-qwen3", load_format="dummy", num_blocks=64, speculative_config=spec))
    prompts = [list(range(3, 19)), list(range(40, 56))]
    greedy = decode_greedy(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    wrong = [[*tokens[:5], (tokens[5] + 1) % engine.info.vocab_size, *tokens[6:]] for tokens in greedy]
    replayed = decode_replayed(engine, prompts, wrong, 12)
    # Round 1 follows the wrong recording up to its 6th token and emits the greedy tokens; round 2 replays those.
    assert (replayed.rounds, replayed.same_tokens, replayed.outputs) == (2, True, greedy)
    assert (replayed.stats.draft_tokens, replayed.stats.accepted_tokens, replayed.stats.verify_steps) == (14, 14, 8)
    assert replayed.figures["requests"] == 2


def _tiny_model_with_smollm2_tokenizer(smollm2_path: Path, folder: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,  # NOTE: a tied random model tends to repeat its input: the proposer gets work
    )
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_path / name, folder / name)
    return folder


def test_w10_real_acceptance_agrees_with_the_engine(smollm2_path: Path, tmp_path: Path) -> None:
    model = _tiny_model_with_smollm2_tokenizer(smollm2_path, tmp_path / "model")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "copy.txt").write_text("copy task\n%%%\nRepeat: a b c a b c a b c\n%%%\nSay 1 2 3 1 2 3 1 2 3.\n")
    out = tmp_path / "study.json"
    args = ["bench", "--workload", "w10", "--model", str(model), "--spec-tasks", str(tasks), "--spec-k", "3,1"]
    assert (
        pdserve_main([*args, "--output-len", "24", "--step-ms", "6.0,6.6", "--check-engine", "--json", str(out)]) == 0
    )
    task = json.loads(out.read_text())["tasks"]["copy"]
    assert task["prompts"] == 2
    check = task["engine_check"]
    assert check["greedy_tokens_equal"] and check["stats_equal_computed"], check
    assert check["engine_spec_stats"]["draft_tokens"] > 0
    k3 = task["k3"]
    assert k3["effective_tpot_ms"] == pytest.approx(6.6 / k3["tokens_per_step"])
    assert k3["decode_steps"] + k3["accepted_tokens"] == task["output_tokens"] - 2  # first tokens from prefill
