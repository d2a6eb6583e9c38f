"""The stand-in decode pod's step (bench/online/standin_pods.py): one message per step with one token for every
running request of the stream, and the end of each request that reached its max_tokens."""

from __future__ import annotations

from bench.online.standin_pods import StandinDecode
from pdserve.v1 import sampling_pb2


def test_a_step_carries_one_token_per_running_request_and_ends_the_finished_ones() -> None:
    left = {1: 2, 2: 1}
    first = StandinDecode._step(left)
    assert list(first.keys) == [1, 2]
    assert list(first.num_tokens) == [1, 1]
    assert list(first.token_ids) == [1, 2]
    assert [(end.key, end.finish_reason) for end in first.ends] == [(2, sampling_pb2.FINISH_REASON_LENGTH)]
    assert left == {1: 1}
    second = StandinDecode._step(left)
    assert list(second.keys) == [1]
    assert [end.key for end in second.ends] == [1]
    assert left == {}
