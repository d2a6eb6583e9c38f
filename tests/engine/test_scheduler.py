"""Scheduler unit tests: exact schedules for continuous batching, chunking, budgets and preemption."""

from __future__ import annotations

from common.errors import ResourceExhaustedError
from common.sampling_params import SamplingParams
from engine.config import CPU_CHUNK_TOKENS, SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import Scheduler
from engine.scheduler_output import PLACEHOLDER_TOKEN_ID, EngineOutput, FailedOutput, RunnerOutput, SchedulerOutput

BLOCK = 4


def make_scheduler(num_blocks: int = 64, **config: int | str) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK)
    return Scheduler(SchedulerConfig(**config), kv, max_model_len=1024)  # type: ignore[arg-type]


def request(req_id: str, num_prompt: int, max_tokens: int = 4, priority: int = 0, first: int = 100) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, priority=priority)
    return Request(req_id, list(range(first, first + num_prompt)), params)


def step(scheduler: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list[EngineOutput]]:
    """One step with a fake runner that samples `token` for every request that asks."""
    out = scheduler.schedule()
    sampled = {r.req_id: token for r in out.scheduled if r.sample}
    return out, scheduler.update_from_output(out, RunnerOutput(sampled, dict.fromkeys(sampled)))


def shape(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [(r.req_id, r.num_computed_tokens, len(r.token_ids), r.sample) for r in out.scheduled]


def test_new_request_joins_running_batch_next_step() -> None:
    s = make_scheduler()
    s.add_request(request("a", 5, max_tokens=10))
    out, _ = step(s)
    assert shape(out) == [("a", 0, 5, True)]
    out, _ = step(s)
    assert shape(out) == [("a", 5, 1, True)]
    s.add_request(request("b", 3))
    out, outputs = step(s)
    assert shape(out) == [("a", 6, 1, True), ("b", 0, 3, True)]
    assert [(o.req_id, o.new_token_ids) for o in outputs] == [("a", [7]), ("b", [7])]


def test_chunked_prefill_respects_chunk_and_budget_with_decodes_first() -> None:
    s = make_scheduler(max_num_batched_tokens=10, long_prefill_token_threshold=6)
    s.add_request(request("a", 2, max_tokens=10))
    step(s)
    s.add_request(request("b", 20))
    out, _ = step(s)
    assert shape(out) == [("a", 2, 1, True), ("b", 0, 6, False)]
    out, _ = step(s)
    assert shape(out) == [("a", 3, 1, True), ("b", 6, 6, False)]
    out, _ = step(s)
    out, _ = step(s)
    assert shape(out) == [("a", 5, 1, True), ("b", 18, 2, True)]


def test_max_num_seqs_limits_running() -> None:
    s = make_scheduler(max_num_seqs=2)
    for name in "abc":
        s.add_request(request(name, 3))
    out, _ = step(s)
    assert [r.req_id for r in out.scheduled] == ["a", "b"]
    assert s.num_waiting == 1


def test_finished_requests_return_blocks_and_report_reason() -> None:
    s = make_scheduler(num_blocks=8)
    s.add_request(request("a", 5, max_tokens=2))
    _, first = step(s)
    assert first[0].finish_reason is None
    _, second = step(s)
    assert (second[0].finish_reason, second[0].new_token_ids) == ("length", [7])
    assert not s.has_unfinished_requests()
    assert s.kv.num_free_blocks == 8


def test_stop_token_finishes_with_stop_reason() -> None:
    s = make_scheduler()
    params = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=(7,))
    s.add_request(Request("a", [1, 2, 3], params))
    _, outputs = step(s, token=7)
    assert (outputs[0].finish_reason, outputs[0].stop_reason) == ("stop", 7)


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    # 4 blocks of 4 tokens: a (8 tokens) and b (7 tokens) fill 4 blocks; a's growth preempts b.
    s = make_scheduler(num_blocks=4)
    s.add_request(request("a", 7, max_tokens=6))
    s.add_request(request("b", 7, max_tokens=6, first=200))
    out, _ = step(s)
    assert shape(out) == [("a", 0, 7, True), ("b", 0, 7, True)]
    out, _ = step(s)  # both hold 2 blocks; 8 tokens fit
    assert shape(out) == [("a", 7, 1, True), ("b", 7, 1, True)]
    out, _ = step(s)  # a needs a 3rd block: b (newest) is preempted, its blocks freed
    assert shape(out) == [("a", 8, 1, True)]
    assert s.num_preemptions == 1
    b = s.requests["b"]
    assert (b.status, b.num_computed_tokens, b.output_token_ids) == (RequestStatus.PREEMPTED, 0, [7, 7])
    for _ in range(3):
        out, _ = step(s)
        assert [r.req_id for r in out.scheduled] == ["a"]
    assert "a" not in s.requests
    out, _ = step(s)  # b is recomputed: prompt + its 2 outputs
    assert [(r.req_id, r.num_computed_tokens + len(r.token_ids)) for r in out.scheduled] == [("b", 9)]
    # a's third block evicted b's tail block (freed tail first); b's first block still hits the cache.
    assert out.scheduled[0].num_computed_tokens == 4


def test_priority_policy_admits_lower_value_first() -> None:
    s = make_scheduler(max_num_seqs=1, policy="priority")
    s.add_request(request("low", 3, priority=5))
    s.add_request(request("high", 3, priority=1))
    out, _ = step(s)
    assert [r.req_id for r in out.scheduled] == ["high"]


def test_abort_frees_blocks_of_running_and_waiting() -> None:
    s = make_scheduler(num_blocks=8, max_num_seqs=1)
    s.add_request(request("a", 5, max_tokens=10))
    s.add_request(request("b", 5))
    step(s)
    outputs = s.abort_requests(["a", "b", "unknown"])
    assert [(o.req_id, o.finish_reason) for o in outputs] == [("a", "abort"), ("b", "abort")]
    assert s.kv.num_free_blocks == 8
    assert not s.has_unfinished_requests()
    assert s.schedule().finished_req_ids == frozenset({"a", "b"})


def test_held_kv_outlives_request_until_released() -> None:
    s = make_scheduler(num_blocks=8)
    s.add_request(Request("p", list(range(9)), SamplingParams(max_tokens=1), hold_kv=True))
    _, outputs = step(s)
    assert outputs[0].finish_reason == "length"
    assert s.kv_progress("p") == ([0, 1, 2], 9)
    assert s.kv.num_free_blocks == 5
    s.release_kv("p")
    assert s.kv_progress("p") is None
    assert s.kv.num_free_blocks == 8


def test_prefilled_request_continues_from_second_token() -> None:
    s = make_scheduler(num_blocks=8)
    assert s.kv.allocate_slots("d", 9) == [0, 1, 2]
    s.add_request(Request.prefilled("d", list(range(9)), 42, SamplingParams(max_tokens=3), ()))
    out, outputs = step(s)
    assert shape(out) == [("d", 9, 1, True)]
    assert out.scheduled[0].token_ids == [42]
    assert outputs[0].new_token_ids == [7]


def test_async_steps_schedule_a_placeholder_and_apply_tokens_one_step_late() -> None:
    s = make_scheduler()
    s.add_request(request("a", 5, max_tokens=3))
    first = s.schedule()
    second = s.schedule()  # scheduled before the first step's token is known
    assert shape(first) == [("a", 0, 5, True)]
    assert shape(second) == [("a", 5, 1, True)] and second.scheduled[0].token_ids == [PLACEHOLDER_TOKEN_ID]
    assert [o.new_token_ids for o in s.update_from_output(first, RunnerOutput({"a": 7}, {"a": None}))] == [[7]]
    third = s.schedule()
    assert shape(third) == [("a", 6, 1, True)] and third.scheduled[0].token_ids == [PLACEHOLDER_TOKEN_ID]
    s.update_from_output(second, RunnerOutput({"a": 8}, {"a": None}))
    # Tokens 7, 8 and the one in flight reach max_tokens: nothing more is scheduled.
    idle = s.schedule()
    assert idle.scheduled == []
    assert s.update_from_output(idle, RunnerOutput()) == []
    (last,) = s.update_from_output(third, RunnerOutput({"a": 9}, {"a": None}))
    assert (last.new_token_ids, last.finish_reason) == ([9], "length")
    assert s.kv.num_free_blocks == 64 and not s.has_unfinished_requests()


def test_aborted_request_in_flight_gets_no_output() -> None:
    s = make_scheduler()
    s.add_request(request("a", 3, max_tokens=5))
    first = s.schedule()
    s.abort_requests(["a"])
    s.add_request(request("a", 4, max_tokens=5, first=200))  # the id is free again at once
    assert s.update_from_output(first, RunnerOutput({"a": 7}, {"a": None})) == []
    out, outputs = step(s)
    assert shape(out) == [("a", 0, 4, True)] and [o.new_token_ids for o in outputs] == [[7]]


def test_release_of_a_running_held_request_frees_its_blocks_when_it_finishes() -> None:
    s = make_scheduler()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    s.add_request(Request("p", list(range(10)), params, hold_kv=True))
    first = s.schedule()  # the prompt's last step: its token is still in flight
    s.release_kv("p")  # the transfer was acked meanwhile
    assert s.kv.num_free_blocks == 64 - 3
    (out,) = s.update_from_output(first, RunnerOutput({"p": 7}, {"p": None}))
    assert out.finish_reason == "length" and "p" not in s.held_kv and s.kv.num_free_blocks == 64


def test_a_cpu_scheduler_chunks_prompts_unless_a_chunk_size_is_set() -> None:
    assert SchedulerConfig().for_device("cpu").chunk_size == CPU_CHUNK_TOKENS == 256
    assert SchedulerConfig().for_device("cuda").chunk_size == 8192
    assert SchedulerConfig(long_prefill_token_threshold=1024).for_device("cpu").chunk_size == 1024


def test_requests_that_cannot_be_recomputed_are_passed_over_then_ended() -> None:
    # A decode pod's view (priority policy): three prefilled requests of 2 blocks each fill the 6 blocks; the image
    # prompts (not recomputable) sit at both ends of the priority order.
    s = make_scheduler(num_blocks=6, policy="priority")
    for req_id, priority, recomputable in (("img_hi", 0, False), ("text", 1, True), ("img_lo", 2, False)):
        assert len(s.kv.allocate_slots(req_id, 7) or []) == 2
        params = SamplingParams(max_tokens=10, priority=priority)
        s.add_request(Request.prefilled(req_id, list(range(7)), 42, params, (), recomputable=recomputable))
    out, _ = step(s)
    assert shape(out) == [("img_hi", 7, 1, True), ("text", 7, 1, True), ("img_lo", 7, 1, True)]
    out, _ = step(s)  # img_hi needs a 3rd block: img_lo comes first in preemption order but is passed over
    assert shape(out) == [("img_hi", 8, 1, True), ("img_lo", 8, 1, True)]
    assert (s.num_preemptions, s.requests["text"].status) == (1, RequestStatus.PREEMPTED)
    for computed in (9, 10, 11):
        out, _ = step(s)
        assert shape(out) == [("img_hi", computed, 1, True), ("img_lo", computed, 1, True)]
    out, outputs = step(s)  # img_hi needs a 4th block and only image prompts run: img_lo ends, no recompute
    # ... and the text request comes back in its place, its 8 computed tokens found in the prefix cache
    assert shape(out) == [("img_hi", 12, 1, True), ("text", 8, 1, True)]
    (failed,) = [o for o in outputs if isinstance(o, FailedOutput)]
    assert (failed.req_id, failed.finish_reason, type(failed.error)) == ("img_lo", "abort", ResourceExhaustedError)
    assert s.num_preemptions == 1 and "img_lo" not in s.requests
