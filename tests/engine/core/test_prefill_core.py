"""A prefill pod's engine core (PrefillKV) against a recording KV sender: the chunks it ships, in order, the keepalives
of a queued request (also while the engine is inside one long step), the abort of a transfer cancelled before its
first chunk, and the prefill progress and cache events it reports."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from common.sampling_params import SamplingParams
from engine.core.commands import AbortRequest, AddRequest
from engine.core.engine_core import EngineCore
from engine.core.outputs import CoreOutputs
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from kv_transfer.state import TransferState
from kv_transfer.target import KVTarget
from tests.engine.core.core_support import RecordingSender, drive, tokens_of

FIRST = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


@contextmanager
def _core(model: Path, **engine_args: object) -> Iterator[tuple[EngineCore, RecordingSender]]:
    engine = LLMEngine(engine_config(str(model), num_blocks=64, **engine_args))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    core = EngineCore(engine, sender=sender)
    try:
        yield core, sender
    finally:
        core.close()


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(length)]


def _add(
    core: EngineCore,
    sender: RecordingSender,
    req_id: str,
    prompt: list[int],
    block_ids: tuple[int, ...],
    lease_s: float = 10.0,
    endpoint: str = "127.0.0.1:1",
) -> None:
    target = KVTarget(req_id, "tcp", endpoint, block_ids, sender.layout, lease_s)
    core.apply(AddRequest(req_id, prompt, FIRST, target, keepalive_s=lease_s / 3))


def _ended(outputs: list[CoreOutputs]) -> dict[str, TransferState]:
    return {e.req_id: e.state for out in outputs for e in out.transfers_ended}


def test_chunks_in_order_and_keepalives_while_queued(core_model: Path) -> None:
    with _core(core_model, max_num_seqs=1, long_prefill_token_threshold=16) as (core, sender):
        long_prompt, short_prompt = _prompt(0, 600), _prompt(1, 20)
        # max_num_seqs=1: the short request waits for the long one's 38 prefill steps, longer than a third of its
        # 0.03 s lease, so it keeps its reservation alive with empty chunks (the long one, computing, needs none).
        _add(core, sender, "long", long_prompt, tuple(range(100, 138)))
        _add(core, sender, "short", short_prompt, (7, 9), lease_s=0.03)
        outputs = drive(core, lambda outs: len(_ended(outs)) == 2)
        assert _ended(outputs) == {"long": TransferState.DONE, "short": TransferState.DONE}
        long_sends = [s for s in sender.sends if s[0] == "long"]
        # One block per 16-token step: 37 full ones, then the partial last block (8 tokens) as the last chunk.
        assert [dst for _, _, dst, _ in long_sends] == [[100 + i] for i in range(38)]
        assert [last for *_, last in long_sends] == [False] * 37 + [True]
        assert all(src for _, src, _, _ in long_sends)
        short_sends = [s for s in sender.sends if s[0] == "short"]
        chunks = [(len(src), dst, last) for _, src, dst, last in short_sends if src]
        assert chunks == [(1, [7], False), (1, [9], True)] and short_sends[-1][3]
        keepalives = [s for s in short_sends if not s[1]]
        assert short_sends[0] in keepalives and all(s[1:] == ([], [], False) for s in keepalives)
        # Both transfers are DONE: the held blocks are freed.
        drive(core, lambda outs: bool(outs) and outs[-1].load.num_free_blocks == 64)


def test_progress_counts_every_chunk_and_the_cache_events_name_the_stored_blocks(core_model: Path) -> None:
    with _core(core_model, long_prefill_token_threshold=16) as (core, sender):
        _add(core, sender, "r", _prompt(2, 40), (1, 2, 3))
        outputs = drive(core, lambda outs: "r" in _ended(outs))
        progress = [(p.num_computed_tokens, p.num_cached_tokens) for out in outputs for p in out.prefill_progress]
        assert progress == [(16, 0), (32, 0), (40, 0)]
        assert len(tokens_of(outputs, "r")) == 1
        stored = [event for out in outputs for event in out.cache_events]
        assert len(stored) >= 2  # the two full blocks, published for the prefix directory


def test_transfer_done_before_the_first_token_is_seen(core_model: Path) -> None:
    """Async scheduling: the last chunk ships (and its ack can arrive) while the first token is still in flight."""
    with _core(core_model, async_scheduling=True) as (core, sender):
        for index in range(5):
            _add(core, sender, f"t{index}", _prompt(index, 40), (3, 5, 8))
            outputs = drive(core, lambda outs, i=index: f"t{i}" in _ended(outs) and bool(tokens_of(outs, f"t{i}")))
            assert _ended(outputs)[f"t{index}"] is TransferState.DONE
        drive(core, lambda outs: bool(outs) and outs[-1].load.num_free_blocks == 64)


def test_an_abort_before_the_first_chunk_aborts_the_transfer_at_its_endpoint(core_model: Path) -> None:
    with _core(core_model, max_num_seqs=1, long_prefill_token_threshold=16) as (core, sender):
        _add(core, sender, "long", _prompt(3, 600), tuple(range(100, 138)))
        _add(core, sender, "short", _prompt(4, 20), (7, 9), endpoint="127.0.0.1:2")
        drive(core, lambda outs: bool(sender.sends))
        # max_num_seqs=1: the short request waits behind the long one's 38 prefill steps; it is aborted there.
        core.apply(AbortRequest("short"))
        outputs = drive(core, lambda outs: "long" in _ended(outs))
        assert not [s for s in sender.sends if s[0] == "short"]
        # The decode pod's receiver must hear of it: its reservation would otherwise wait for its lease.
        assert sender.aborts == [("short", "127.0.0.1:2")]
        assert tokens_of(outputs, "short") == []
        drive(core, lambda outs: bool(outs) and outs[-1].load.num_free_blocks == 64)


def test_keepalives_go_out_while_the_engine_is_inside_a_long_step(
    core_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _core(core_model) as (core, sender):
        step_running, step_done = threading.Event(), threading.Event()
        step = core.engine.step

        def long_step() -> object:
            step_running.set()
            step_done.wait(5.0)
            return step()

        monkeypatch.setattr(core.engine, "step", long_step)
        _add(core, sender, "queued", _prompt(5, 20), (7, 9), lease_s=0.03)
        turn = threading.Thread(target=core.turn)
        turn.start()
        assert step_running.wait(5.0)
        time.sleep(0.2)
        # The engine is inside its step; the request's reservation is kept alive all the same.
        assert len(sender.sends) >= 3 and all(s == ("queued", [], [], False) for s in sender.sends)
        step_done.set()
        turn.join()
        monkeypatch.setattr(core.engine, "step", step)
        outputs = drive(core, lambda outs: "queued" in _ended(outs))
        assert _ended(outputs) == {"queued": TransferState.DONE}
        assert [(len(src), dst, last) for _, src, dst, last in sender.sends if src] == [(2, [7, 9], True)]


def test_the_load_counts_queued_prompt_tokens_and_times_steps(core_model: Path) -> None:
    with _core(core_model, max_num_seqs=1, long_prefill_token_threshold=16) as (core, sender):
        assert (core.load().queued_prompt_tokens, core.load().step_ms) == (0, 0.0)
        _add(core, sender, "long", _prompt(0, 600), tuple(range(100, 138)))
        _add(core, sender, "short", _prompt(1, 20), (7, 9))
        assert core.turn().load.queued_prompt_tokens == 620 - 16  # one 16-token chunk of the long prompt computed
        assert core.turn().load.queued_prompt_tokens == 620 - 32
        drive(core, lambda outs: len(_ended(outs)) == 2)
        assert (core.load().queued_prompt_tokens, core.load().step_ms) == (0, 0.0)


def test_step_time_is_a_moving_average_of_the_intervals_between_step_starts(core_model: Path) -> None:
    with _core(core_model) as (core, _):
        for started_ms, average_ms in ((1000, 0.0), (1010, 10.0), (1030, 12.0), (1031, 9.8)):
            core._time_step(started_ms * 1_000_000)
            assert core._step_ms == pytest.approx(average_ms, abs=1e-9)
