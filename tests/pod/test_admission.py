"""Admission decisions (pod.admission): each limit, the retry delay from the drain rate and its bounds."""

from __future__ import annotations

import pytest

from common.errors import ResourceExhaustedError
from engine.config import SchedulerConfig
from pod.admission import Admission, AdmissionLimits
from pod.config import PodAdmissionConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(admission: Admission, client_id: str, num_prompt_tokens: int) -> ResourceExhaustedError:
    with pytest.raises(ResourceExhaustedError) as info:
        admission.admit(client_id, num_prompt_tokens)
    return info.value


def test_the_waiting_request_limit_refuses_the_next_and_admits_again_once_one_starts() -> None:
    admission = Admission(AdmissionLimits(max_waiting_requests=2, max_retry_s=3.0), Clock())
    first = admission.admit("a", 10)
    admission.admit("b", 10)
    error = refused(admission, "c", 10)
    assert str(error) == "overloaded: 2 requests waiting (limit 2)"
    assert error.retry_after_s == 3.0  # nothing drained yet: the upper bound
    admission.start(first)
    assert (admission.num_waiting, admission.num_queued_prompt_tokens) == (1, 10)
    admission.admit("c", 10)
    assert admission.num_waiting == 2


def test_the_token_limit_counts_the_new_prompt_but_never_refuses_into_an_empty_queue() -> None:
    admission = Admission(AdmissionLimits(max_queued_prompt_tokens=100))
    huge = admission.admit("a", 500)
    assert str(refused(admission, "a", 1)) == "overloaded: 501 prompt tokens would wait (limit 100)"
    admission.finish(huge)
    small = admission.admit("a", 60)
    admission.admit("a", 40)
    assert str(refused(admission, "a", 1)) == "overloaded: 101 prompt tokens would wait (limit 100)"
    admission.start(small)
    admission.admit("a", 60)
    assert admission.num_queued_prompt_tokens == 100


def test_the_per_client_limit_counts_streams_until_they_finish_not_start() -> None:
    admission = Admission(AdmissionLimits(max_streams_per_client=2))
    one, two = admission.admit("a", 1), admission.admit("a", 1)
    admission.start(one)
    admission.start(two)
    assert str(refused(admission, "a", 1)) == "overloaded: client 'a' has 2 streams open (limit 2)"
    admission.admit("b", 1)
    admission.finish(one)
    admission.finish(one)  # idempotent
    assert admission.num_streams("a") == 1
    admission.admit("a", 1)
    assert (admission.num_streams("a"), admission.num_streams("b")) == (2, 1)


def test_finish_without_start_leaves_the_queue_too() -> None:
    admission = Admission(AdmissionLimits())
    ticket = admission.admit("a", 7)
    admission.finish(ticket)
    assert (admission.num_waiting, admission.num_queued_prompt_tokens, admission.num_streams("a")) == (0, 0, 0)


def test_zero_limits_admit_everything() -> None:
    admission = Admission(AdmissionLimits())
    for _ in range(1000):
        admission.admit("a", 10_000)
    assert admission.num_waiting == 1000


def test_the_retry_delay_is_the_queue_over_the_recent_drain_rate_within_bounds() -> None:
    clock = Clock()
    admission = Admission(AdmissionLimits(max_waiting_requests=10, min_retry_s=0.05, max_retry_s=5.0), clock)
    tickets = [admission.admit("a", 100) for _ in range(10)]
    admission.start(tickets[0])
    clock.now += 2.0
    admission.start(tickets[1])
    # 200 tokens drained over 2 s (100 tokens/s); 800 wait: 8 s, bounded to 5 s
    assert admission.retry_after_s() == 5.0
    for ticket in tickets[2:8]:
        admission.start(ticket)
    # 800 tokens over 2 s (400/s); 200 wait: 0.5 s
    assert admission.retry_after_s() == 0.5
    assert admission.admit("a", 100) is not None
    admission.start(tickets[8])
    admission.start(tickets[9])
    # 1000 over 2 s; 100 wait: 0.2 s
    assert admission.retry_after_s() == pytest.approx(0.2)
    clock.now += 20.0  # the window forgot every start: the upper bound again
    assert admission.retry_after_s() == 5.0


def test_the_retry_delay_never_goes_below_its_lower_bound_and_uses_a_one_second_span_at_least() -> None:
    clock = Clock()
    admission = Admission(AdmissionLimits(min_retry_s=0.05), clock)
    admission.start(admission.admit("a", 1000))
    admission.admit("a", 10)
    # 1000 tokens over (at least) 1 s; 10 wait: 0.01 s, raised to the 0.05 s floor
    assert admission.retry_after_s() == 0.05


def test_check_refuses_as_admit_would_but_counts_nothing() -> None:
    admission = Admission(AdmissionLimits(max_waiting_requests=1, max_queued_prompt_tokens=100))
    admission.check("a")
    admission.admit("a", 150)
    with pytest.raises(ResourceExhaustedError, match=r"^overloaded: 1 requests waiting \(limit 1\)$"):
        admission.check("b")
    assert (admission.num_waiting, admission.num_streams("b")) == (1, 0)


def test_pod_limits_default_to_the_engine_batch_and_explicit_values_win() -> None:
    assert PodAdmissionConfig().limits(SchedulerConfig()) == AdmissionLimits(1024, 65536, 0, 0.05, 5.0)
    assert PodAdmissionConfig().limits(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=512)) == (
        AdmissionLimits(256, 4096, 0, 0.05, 5.0)
    )
    explicit = PodAdmissionConfig(admission_max_waiting_requests=0, admission_max_queued_prompt_tokens=7)
    assert explicit.limits(SchedulerConfig()) == AdmissionLimits(0, 7, 0, 0.05, 5.0)
