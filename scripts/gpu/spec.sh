#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 13): the gpu-marked spec and engine tests, then batch-1 decode on the Qwen3-8B
# shape (random bf16 weights, CUDA graphs on, 128 prompt + 256 output tokens) with the replay proposer at 0%, 30% and
# 100% corruption (k=4) vs off, and batch 64 on vs off. Each corruption level replays the speculating engine's own
# greedy output until it reproduces it (engine.spec.replay.replay_until_reproduced): the timed run is the last round,
# whose tokens equal the recording it replayed. Total run time: about 4 minutes on an H100 (two 8B engines built).
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/spec.sh
# Writes $OUT/spec/tests.txt (pytest) and $OUT/spec/results.json; prints one line per case and one line of per-step
# counts under it, then the acceptance checks (PASS/FAIL).
set -euo pipefail
OUT="${OUT:-/tmp/spec-out}"
mkdir -p "$OUT/spec"
# NOTE: test_gpu_engine.py too: the decode graphs share their capture code with the verify graphs.
python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/spec/test_spec_gpu.py \
  tests/engine/test_gpu_engine.py > "$OUT/spec/tests.txt" 2>&1 || echo "GPU TESTS FAILED (see spec/tests.txt)"
tail -3 "$OUT/spec/tests.txt"
timeout 280 python3 - "$OUT/spec/results.json" <<'PY'
import gc, json, random, statistics, sys, time
from collections import Counter, defaultdict

import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.replay import ReplayProposer, replay_until_reproduced

SHAPE = dict(model="shape:qwen3-8b", load_format="dummy", dtype="bfloat16", num_blocks=2048, max_model_len=2048)
rng = random.Random(0)
PROMPT = [rng.randrange(1000, 100000) for _ in range(128)]
BATCH = [[rng.randrange(1000, 100000) for _ in range(128)] for _ in range(64)]
MAX_ROUNDS = 24
CORRUPTIONS = (0.0, 0.3, 1.0)


class StepCounts:
    """Per-step counts of one engine: steps, steps that waited for the one in flight before scheduling, forward
    passes, graph replays by query length (1: decode, k+1: verify), and step times by tokens returned."""

    def __init__(self, engine):
        self.reset()
        self._events = []
        graphs, runner, scheduler = engine.runner.cuda_graphs, engine.runner, engine.scheduler
        replay, execute = graphs.replay, runner.execute
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def counted_replay(bs, query_len=1):
            self.replays[query_len] += 1
            return replay(bs, query_len)

        def counted_execute(scheduler_output):
            self.forwards += bool(scheduler_output.scheduled)
            return execute(scheduler_output)

        def logged_schedule():
            self._events.append("schedule")
            return schedule()

        def logged_update(*args):
            self._events.append("update")
            return update(*args)

        graphs.replay, runner.execute = counted_replay, counted_execute
        scheduler.schedule, scheduler.update_from_output = logged_schedule, logged_update

    def reset(self):
        self.replays, self.forwards, self.waited, self.step_ms = Counter(), 0, 0, defaultdict(list)

    def step(self, engine):
        self._events.clear()
        start = time.perf_counter()
        outputs = engine.step()
        self.step_ms[sum(len(o.new_token_ids) for o in outputs)].append((time.perf_counter() - start) * 1e3)
        self.waited += self._events[:1] == ["update"]
        return outputs

    def summary(self):
        graphs = sum(self.replays.values())
        return {"steps": sum(len(v) for v in self.step_ms.values()), "waited": self.waited, "forwards": self.forwards,
                "graph_replays": {f"q{q}": n for q, n in sorted(self.replays.items())}, "eager": self.forwards - graphs,
                "step_ms_by_tokens": {str(n): [len(v), round(statistics.mean(v), 3)]
                                      for n, v in sorted(self.step_ms.items())}}


def decode(engine, counts, prompts, max_tokens):
    """Each request's output tokens and the run's (TPOT ms after the first token, output tok/s, step counts)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    tokens = {str(i): [] for i in range(len(prompts))}
    counts.reset()
    first = None
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for o in counts.step(engine):
            tokens[o.req_id] += o.new_token_ids
        if first is None and any(tokens.values()):
            first = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    n = sum(len(t) for t in tokens.values())
    tpot_ms = (end - first) / (max_tokens - 1) * 1e3
    return [tokens[str(i)] for i in range(len(prompts))], tpot_ms, n / (end - start), counts.summary()


def engine_with_counts(**spec):
    engine = LLMEngine(engine_config(**SHAPE, **spec))
    counts = StepCounts(engine)
    for prompts in ([PROMPT], BATCH):  # warm-up: compilation, and the prompts in the prefix cache for every run
        decode(engine, counts, prompts, 32)
    return engine, counts


results = {"device": torch.cuda.get_device_name()}
off, counts = engine_with_counts()
(recording,), tpot_off, _, steps = decode(off, counts, [PROMPT], 256)
_, _, tput_off, batch_steps = decode(off, counts, BATCH, 128)
results["off"] = {"tpot_ms": tpot_off, "batch64_tok_s": tput_off, "steps": steps, "batch64_steps": batch_steps}
print(f"off: batch-1 TPOT {tpot_off:.2f} ms, batch-64 {tput_off:.0f} tok/s", flush=True)
print(f"off steps: {json.dumps(steps)}", flush=True)
print(f"off batch-64 steps: {json.dumps(batch_steps)}", flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=2)
del off
gc.collect()
torch.cuda.empty_cache()
on, counts = engine_with_counts(speculative_config={"method": "replay", "num_speculative_tokens": 4})
proposer = on.speculator.proposer
assert isinstance(proposer, ReplayProposer)
on.set_replay_recordings({tuple(PROMPT): recording})
decode(on, counts, [PROMPT], 32)  # warm-up of the verify steps


def replayed_run():
    before = on.spec_stats
    (tokens,), tpot, _, steps = decode(on, counts, [PROMPT], 256)
    after = on.spec_stats
    drafts, accepted = after.draft_tokens - before.draft_tokens, after.accepted_tokens - before.accepted_tokens
    verify_steps = after.verify_steps - before.verify_steps
    row = {"tpot_ms": tpot, "ratio": tpot / tpot_off, "acceptance_rate": accepted / drafts if drafts else 0.0,
           "mean_accepted_length": 1 + accepted / verify_steps if verify_steps else 0.0, "draft_tokens": drafts}
    return [tokens], (tokens, row, steps)


for corruption in CORRUPTIONS:
    proposer.corruption = corruption
    (recording, row, steps), rounds, same = replay_until_reproduced(
        on.set_replay_recordings, [PROMPT], [recording], replayed_run, MAX_ROUNDS
    )
    row |= {"same_tokens": same, "rounds": rounds}
    if corruption == 0.0:
        _, _, tput, batch_steps = decode(on, counts, BATCH, 128)
        row["batch64_ratio"] = tput / tput_off
    print(f"corruption {corruption}: {json.dumps(row)}", flush=True)
    print(f"corruption {corruption} steps: {json.dumps(steps)}", flush=True)
    results[f"replay_corruption_{corruption}"] = {**row, "steps": steps}
    if corruption == 0.0:
        print(f"corruption {corruption} batch-64 steps: {json.dumps(batch_steps)}", flush=True)
        results[f"replay_corruption_{corruption}"]["batch64_steps"] = batch_steps
    json.dump(results, open(sys.argv[1], "w"), indent=2)
r0, r100 = results["replay_corruption_0.0"], results["replay_corruption_1.0"]
checks = {
    "0% corruption, k=4: batch-1 TPOT ratio <= 0.35": r0["ratio"] <= 0.35,
    "100% corruption: batch-1 TPOT ratio <= 1.05": r100["ratio"] <= 1.05,
    "batch 64: throughput ratio >= 0.97": r0["batch64_ratio"] >= 0.97,
    "every corruption level: same_tokens": all(results[f"replay_corruption_{c}"]["same_tokens"] for c in CORRUPTIONS),
}
results["checks"] = checks
for name, ok in checks.items():
    print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=2)
PY
