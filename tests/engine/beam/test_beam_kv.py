"""Beams share KV blocks: forks take references, a shared block is copied only when a beam writes into it, and every
block goes back to the pool when the request ends or is aborted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.kv_cache_manager import KVCacheManager
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import BeamSearchOutput
from tests.engine.model_factory import save_tiny_model


def _ref_counts(kv: KVCacheManager) -> dict[int, int]:
    return {block.block_id: block.ref_cnt for block in kv.block_pool.blocks if block.ref_cnt}


def test_fork_shares_and_copy_on_write_copies_only_shared_partial_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("a", 6) == [0, 1]  # one full block, one partial
    kv.fork({"b": "a", "c": "a"})
    assert kv.get_block_ids("b") == kv.get_block_ids("c") == [0, 1]
    assert _ref_counts(kv) == {0: 3, 1: 3}
    # "a" is not continued: its beams are b and c. Writing token 6 lands in the shared block 1.
    kv.free("a")
    assert _ref_counts(kv) == {0: 2, 1: 2}
    assert kv.copy_on_write("b", 6) == (1, 2)
    assert kv.get_block_ids("b") == [0, 2]
    # c is now block 1's only holder: it writes in place.
    assert kv.copy_on_write("c", 6) is None
    assert _ref_counts(kv) == {0: 2, 1: 1, 2: 1}
    # A token at a block boundary starts a new block: nothing to copy.
    assert kv.copy_on_write("c", 8) is None
    kv.free("b")
    kv.free("c")
    assert kv.num_free_blocks == 8


def test_fork_swaps_tables_in_one_go() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    kv.allocate_slots("a", 2)
    kv.allocate_slots("b", 2)
    kv.fork({"a": "b", "b": "a"})
    assert (kv.get_block_ids("a"), kv.get_block_ids("b")) == ([1], [0])
    assert _ref_counts(kv) == {0: 1, 1: 1}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("beam-kv"))


def _params(width: int, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(n=width, temperature=0.0, max_tokens=max_tokens, use_beam_search=True, ignore_eos=True)


def _check_sharing(engine: LLMEngine, group_id: str, block_size: int) -> None:
    """Every block's ref count is the number of tables holding it, and beams hold the same block for every full
    block of the tokens they have in common (never two copies of it)."""
    kv = engine.kv_cache_manager
    beams = [r for r in engine.scheduler.requests.values() if r.req_id.split("#")[0] == group_id]
    holders = Counter(b for beam in engine.scheduler.requests.values() for b in kv.get_block_ids(beam.req_id))
    assert holders == Counter(_ref_counts(kv))
    for i, one in enumerate(beams):
        for other in beams[i + 1 :]:
            common = next(
                (k for k, (x, y) in enumerate(zip(one.all_token_ids, other.all_token_ids, strict=False)) if x != y),
                min(one.num_tokens, other.num_tokens),
            )
            num_full = min(common, one.num_computed_tokens, other.num_computed_tokens) // block_size
            assert kv.get_block_ids(one.req_id)[:num_full] == kv.get_block_ids(other.req_id)[:num_full]


def test_beams_share_blocks_and_return_them(tiny_path: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_path), num_blocks=64, block_size=4))
    engine.add_request("r", list(range(10, 19)), _params(4))
    num_steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        num_steps += 1
        if not outputs:
            _check_sharing(engine, "r", 4)
            # 4 beams of 9 + k tokens: the prompt's 2 full blocks are held once, by all four.
            assert engine.kv_cache_manager.usage() * 64 <= 2 + 4 * (-(-12 // 4) + 1)
    assert isinstance(outputs[0], BeamSearchOutput) and len(outputs[0].beams) == 4
    assert num_steps == 12
    assert engine.kv_cache_manager.num_free_blocks == 64


def test_abort_mid_search_returns_every_block(tiny_path: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_path), num_blocks=64, block_size=4))
    engine.add_request("r", list(range(10, 19)), _params(4))
    engine.add_request("s", list(range(30, 35)), SamplingParams(temperature=0.0, max_tokens=4))
    for _ in range(3):
        engine.step()
    assert engine.kv_cache_manager.num_free_blocks < 64
    (aborted,) = engine.abort_requests(["r"])
    assert (aborted.req_id, aborted.finish_reason) == ("r", "abort")
    assert not any(req_id.startswith("r") for req_id in engine.scheduler.requests)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_manager.num_free_blocks == 64


def test_beam_width_and_speculation_are_refused_by_name(tiny_path: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_path), num_blocks=64, max_num_seqs=8, max_beam_width=4))
    with pytest.raises(InvalidArgumentError) as width:
        engine.add_request("r", [1, 2], _params(5))
    assert width.value.field == "n"
    with pytest.raises(InvalidArgumentError) as best_of:
        engine.add_request("r", [1, 2], SamplingParams(best_of=6, temperature=0.0, use_beam_search=True))
    assert best_of.value.field == "best_of"
    spec = LLMEngine(
        engine_config(
            str(tiny_path), num_blocks=64, speculative_config={"method": "ngram", "num_speculative_tokens": 2}
        )
    )
    with pytest.raises(InvalidArgumentError) as speculative:
        spec.add_request("r", [1, 2], _params(2))
    assert speculative.value.field == "use_beam_search"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"best_of": 0}, "best_of"),
        ({"temperature": 0.7}, "temperature"),
        ({"stop": ["x"]}, "stop"),
        ({"early_stopping": "sometimes"}, "early_stopping"),
    ],
)
def test_bad_beam_params_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        SamplingParams(**{"temperature": 0.0, "use_beam_search": True, **kwargs})  # type: ignore[arg-type]
    assert err.value.field == field


def test_preempted_beams_give_the_same_beams(tiny_path: Path) -> None:
    """A pool too small for every beam at once: beams are preempted, recomputed, and the search ends the same."""
    prompts = [list(range(10, 24)), list(range(50, 61))]

    def search(num_blocks: int) -> tuple[list[list[tuple[int, ...]]], int]:
        engine = LLMEngine(engine_config(str(tiny_path), num_blocks=num_blocks, block_size=4, max_model_len=40))
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, _params(4, max_tokens=6))
        beams: dict[str, list[tuple[int, ...]]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert isinstance(out, BeamSearchOutput)
                beams[out.req_id] = [b.beam.token_ids for b in out.beams]
        assert engine.kv_cache_manager.num_free_blocks == num_blocks
        return [beams["0"], beams["1"]], engine.scheduler.num_preemptions

    roomy, num_roomy_preemptions = search(256)
    tight, num_tight_preemptions = search(14)
    assert num_roomy_preemptions == 0 and num_tight_preemptions > 0
    assert tight == roomy
