"""A decode pod's engine core (DecodeKV over the in-process receiver), fed by a prefill pod's core (in-process sender):
reserve + lease and claim + admit as engine-side operations, and every way a reservation ends."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.sampling_params import SamplingParams
from engine.core.commands import AbortRequest, AddPrefilledRequest, AddRequest, ReleaseKV, ReserveKV
from engine.core.engine_core import EngineCore
from engine.core.outputs import CoreOutputs
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from kv_transfer.in_process import InProcessReceiver, InProcessSender
from kv_transfer.state import TransferState
from kv_transfer.target import KVTarget
from tests.engine.core.core_support import drive, finish_of, tokens_of

NUM_BLOCKS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@dataclass
class Pair:
    prefill: EngineCore
    decode: EngineCore
    receiver: InProcessReceiver


@contextmanager
def _pair(model: Path) -> Iterator[Pair]:
    prefill_engine = LLMEngine(engine_config(str(model), num_blocks=NUM_BLOCKS))
    decode_engine = LLMEngine(engine_config(str(model), num_blocks=NUM_BLOCKS))
    sender = InProcessSender(prefill_engine.runner.kv_cache, 16)
    receiver = InProcessReceiver(decode_engine.runner.kv_cache, 16)
    pair = Pair(EngineCore(prefill_engine, sender=sender), EngineCore(decode_engine, receiver=receiver), receiver)
    try:
        yield pair
    finally:
        pair.prefill.close()
        pair.decode.close()


def _prompt(seed: int, length: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(length)]


def _reserve(core: EngineCore, req_id: str, num_tokens: int, lease_s: float = 30.0) -> tuple[int, ...] | None:
    core.apply(ReserveKV(req_id, num_tokens, lease_s))
    (reply,) = core.turn().replies
    assert reply.req_id == req_id
    return reply.block_ids


def _prefill(pair: Pair, req_id: str, prompt: list[int], block_ids: tuple[int, ...]) -> int:
    """Prefill `prompt` into the reserved blocks; its first token (once the transfer is DONE)."""
    target = KVTarget(req_id, "in_process", pair.receiver.endpoint, block_ids, pair.receiver.layout, 30.0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    pair.prefill.apply(AddRequest(req_id, prompt, params, target, keepalive_s=10.0))
    outputs = drive(pair.prefill, lambda outs: any(e.req_id == req_id for out in outs for e in out.transfers_ended))
    (ended,) = [e for out in outputs for e in out.transfers_ended]
    assert (ended.state, ended.error) == (TransferState.DONE, None)
    assert ended.stats.num_blocks == len(block_ids)
    return tokens_of(outputs, req_id)[0]


def _failures(outputs: list[CoreOutputs]) -> list[tuple[str, str | None, str | None]]:
    return [(f.req_id, f.error.field, f.error.code) for out in outputs for f in out.failures]


def test_claim_and_admit_decodes_what_the_offline_engine_does(core_model: Path) -> None:
    prompt = _prompt(0)
    offline = LLMEngine(engine_config(str(core_model), num_blocks=NUM_BLOCKS))
    offline.add_request("offline", prompt, GREEDY)
    expected = [
        t for _ in range(100) if offline.has_unfinished_requests() for o in offline.step() for t in o.new_token_ids
    ]
    with _pair(core_model) as pair:
        block_ids = _reserve(pair.decode, "r", len(prompt))
        assert block_ids is not None and len(block_ids) == 3
        assert pair.decode.load().num_free_blocks == NUM_BLOCKS - 3
        first = _prefill(pair, "r", prompt, block_ids)
        pair.decode.apply(AddPrefilledRequest("r", prompt, first, GREEDY))
        outputs = drive(pair.decode, lambda outs: finish_of(outs, "r") is not None)
        assert [first, *tokens_of(outputs, "r")] == expected
        assert finish_of(outputs, "r") == "length"
        assert outputs[-1].load.num_free_blocks == NUM_BLOCKS
        # The prefill pod freed its held blocks once the transfer was DONE.
        assert pair.prefill.load().num_free_blocks == NUM_BLOCKS


def test_the_load_counts_the_blocks_of_reservations_not_admitted(core_model: Path) -> None:
    with _pair(core_model) as pair:
        prompt = _prompt(5)
        block_ids = _reserve(pair.decode, "r", len(prompt))
        assert block_ids is not None
        _reserve(pair.decode, "s", 40)
        _reserve(pair.decode, "a", 17)
        load = pair.decode.load()
        assert (load.num_free_blocks, load.num_reserved_blocks) == (NUM_BLOCKS - 8, 8)
        pair.decode.apply(AbortRequest("a"))
        assert pair.decode.turn().load.num_reserved_blocks == 6
        # "r" is admitted: its blocks stay in use but are no longer reserved.
        first = _prefill(pair, "r", prompt, block_ids)
        pair.decode.apply(AddPrefilledRequest("r", prompt, first, GREEDY))
        outputs = drive(pair.decode, lambda outs: bool(tokens_of(outs, "r")))
        assert (outputs[-1].load.num_free_blocks, outputs[-1].load.num_reserved_blocks) == (NUM_BLOCKS - 6, 3)
        pair.decode.apply(ReleaseKV("s"))
        outputs = drive(pair.decode, lambda outs: any(out.reservations_ended for out in outs))
        assert outputs[-1].load.num_reserved_blocks == 0
        assert pair.prefill.load().num_reserved_blocks == 0


def test_a_full_pool_answers_none_and_reserves_nothing(core_model: Path) -> None:
    with _pair(core_model) as pair:
        assert _reserve(pair.decode, "big", (NUM_BLOCKS - 1) * 16) is not None
        assert _reserve(pair.decode, "more", 40) is None
        assert pair.decode.load().num_free_blocks == 1


def test_release_frees_the_blocks_and_reports_the_reservation_ended(core_model: Path) -> None:
    with _pair(core_model) as pair:
        _reserve(pair.decode, "r", 40)
        pair.decode.apply(ReleaseKV("r"))
        outputs = drive(pair.decode, lambda outs: any(out.reservations_ended for out in outs))
        assert [(e.req_id, e.state) for out in outputs for e in out.reservations_ended] == [
            ("r", TransferState.ABORTED)
        ]
        assert outputs[-1].load.num_free_blocks == NUM_BLOCKS


def test_an_abort_sent_right_after_a_reserve_frees_what_it_reserved(core_model: Path) -> None:
    with _pair(core_model) as pair:
        # NOTE: commands apply in order: the abort finds the reservation made, whatever the pod's front knew.
        pair.decode.apply(ReserveKV("r", 40, 30.0))
        pair.decode.apply(AbortRequest("r"))
        outputs = drive(pair.decode, lambda outs: outs[-1].load.num_free_blocks == NUM_BLOCKS if outs else False)
        assert [reply.block_ids is not None for out in outputs for reply in out.replies] == [True]


def test_an_unclaimed_reservation_lapses_with_its_lease(core_model: Path) -> None:
    with _pair(core_model) as pair:
        _reserve(pair.decode, "r", 40, lease_s=0.05)
        outputs = drive(pair.decode, lambda outs: any(out.reservations_ended for out in outs), timeout_s=5.0)
        assert [(e.req_id, e.state) for out in outputs for e in out.reservations_ended] == [
            ("r", TransferState.EXPIRED)
        ]
        assert (outputs[-1].load.num_free_blocks, outputs[-1].load.num_reserved_blocks) == (NUM_BLOCKS, 0)


def test_claiming_a_transfer_that_ended_fails_the_request(core_model: Path) -> None:
    with _pair(core_model) as pair:
        prompt = _prompt(1)
        _reserve(pair.decode, "r", len(prompt))
        pair.decode.apply(ReleaseKV("r"))
        pair.decode.apply(AddPrefilledRequest("r", prompt, 7, GREEDY))
        outputs = drive(pair.decode, lambda outs: bool(_failures(outs)))
        (failure,) = _failures(outputs)
        assert failure[:2] == ("r", None) and failure[2] in ("aborted", "unknown_transfer")
        assert (pair.decode.load().num_free_blocks, pair.decode.load().num_reserved_blocks) == (NUM_BLOCKS, 0)
        assert not pair.decode.busy


def test_bad_input_fails_the_request_naming_the_field_and_frees_its_reservation(core_model: Path) -> None:
    with _pair(core_model) as pair:
        prompt = _prompt(2)
        _reserve(pair.decode, "short", len(prompt))
        _reserve(pair.decode, "vocab", len(prompt))
        pair.decode.apply(AddPrefilledRequest("short", prompt, 7, SamplingParams(max_tokens=1)))
        pair.decode.apply(AddPrefilledRequest("vocab", prompt, 100_000, GREEDY))
        outputs = drive(pair.decode, lambda outs: len(_failures(outs)) == 2)
        assert _failures(outputs) == [("short", "max_tokens", None), ("vocab", "first_token_id", None)]
        outputs = drive(pair.decode, lambda outs: len([e for out in outs for e in out.reservations_ended]) == 2)
        assert (outputs[-1].load.num_free_blocks, outputs[-1].load.num_reserved_blocks) == (NUM_BLOCKS, 0)


def test_a_prompt_that_does_not_fit_its_reservation_fails_once_the_transfer_is_done(core_model: Path) -> None:
    with _pair(core_model) as pair:
        prompt = _prompt(4)
        block_ids = _reserve(pair.decode, "r", len(prompt))
        assert block_ids is not None
        first = _prefill(pair, "r", prompt, block_ids)
        pair.decode.apply(AddPrefilledRequest("r", prompt + prompt, first, GREEDY))
        outputs = drive(pair.decode, lambda outs: bool(_failures(outs)))
        assert _failures(outputs) == [("r", "prompt_token_ids", None)]
        drive(pair.decode, lambda outs: bool(outs) and outs[-1].load.num_free_blocks == NUM_BLOCKS)


def test_a_second_start_of_a_transfer_fails_alone(core_model: Path) -> None:
    with _pair(core_model) as pair:
        prompt = _prompt(3)
        block_ids = _reserve(pair.decode, "r", len(prompt))
        assert block_ids is not None
        first = _prefill(pair, "r", prompt, block_ids)
        pair.decode.apply(AddPrefilledRequest("r", prompt, first, GREEDY))
        pair.decode.apply(AddPrefilledRequest("r", prompt, first, GREEDY))
        outputs = drive(pair.decode, lambda outs: finish_of(outs, "r") is not None)
        assert _failures(outputs) == [("r", "transfer_id", None)]
        assert len(tokens_of(outputs, "r")) == GREEDY.max_tokens - 1
