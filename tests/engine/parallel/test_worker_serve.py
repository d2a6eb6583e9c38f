"""A parallel worker's step loop: it launches a step as soon as its message arrives, before the previous step's
output is ready, and the output rank answers in step order once each output is ready."""

from __future__ import annotations

import pickle
import threading
from multiprocessing import Pipe
from typing import Any

from engine.parallel import worker

TIMEOUT_S = 5.0


class _Pending:
    def __init__(self, step: str) -> None:
        self.step = step
        self.done = threading.Event()

    def ready(self) -> bool:
        return self.done.is_set()

    def result(self) -> str:
        assert self.done.is_set(), f"{self.step}: result() before the step ended"
        return f"output of {self.step}"


class _Runner:
    def __init__(self) -> None:
        self.pending: dict[str, _Pending] = {}
        self.launched = threading.Condition()

    def execute(self, step: str) -> _Pending:
        with self.launched:
            self.pending[step] = _Pending(step)
            self.launched.notify_all()
        return self.pending[step]

    def wait_launched(self, step: str) -> _Pending:
        with self.launched:
            assert self.launched.wait_for(lambda: step in self.pending, TIMEOUT_S), f"{step} never launched"
        return self.pending[step]


def _serve(answers: bool) -> tuple[_Runner, Any, threading.Thread]:
    engine_end, worker_end = Pipe()
    runner = _Runner()
    thread = threading.Thread(target=worker._serve, args=(runner, worker_end, answers), daemon=True)
    thread.start()
    return runner, engine_end, thread


def test_the_next_step_launches_before_the_previous_output_and_outputs_come_in_order() -> None:
    runner, engine, thread = _serve(answers=True)
    engine.send_bytes(pickle.dumps("step 1"))
    first = runner.wait_launched("step 1")
    engine.send_bytes(pickle.dumps("step 2"))
    second = runner.wait_launched("step 2")
    assert not engine.poll(0.05)  # step 1 still running: nothing answered yet
    second.done.set()
    assert not engine.poll(0.05)  # step 2 ended first, but step 1's output goes first
    first.done.set()
    assert [pickle.loads(engine.recv_bytes()) for _ in range(2)] == ["output of step 1", "output of step 2"]
    engine.send_bytes(b"")
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()


def test_a_rank_that_does_not_answer_never_waits_for_its_steps() -> None:
    runner, engine, thread = _serve(answers=False)
    for step in ("step 1", "step 2", "step 3"):
        engine.send_bytes(pickle.dumps(step))
        runner.wait_launched(step)
    assert not any(p.ready() for p in runner.pending.values())
    engine.close()  # the engine's end closed: the loop ends
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()
