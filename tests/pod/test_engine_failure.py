"""A pod whose engine fails (e.g. a dead worker process of a parallel engine) stops serving at once, instead of
staying in routing with an engine that runs no step; parallel pods take their sizes from the command line."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pod.config import parse_pod_config
from pod.run import _serve_until_stopping


def _runtime() -> Any:
    return SimpleNamespace(stopping=asyncio.Event(), role="decode", pod_id="decode-1")


def test_engine_failure_ends_serving_within_a_check_period() -> None:
    async def scenario() -> bool:
        runtime, front = _runtime(), SimpleNamespace(engine_failed=False)
        serving = asyncio.create_task(_serve_until_stopping(runtime, front))
        await asyncio.sleep(0.3)
        assert not serving.done()
        front.engine_failed = True
        return await asyncio.wait_for(serving, 1.0)

    assert asyncio.run(scenario()) is True


def test_stopping_ends_serving_without_failure() -> None:
    async def scenario() -> bool:
        runtime, front = _runtime(), SimpleNamespace(engine_failed=False)
        serving = asyncio.create_task(_serve_until_stopping(runtime, front))
        runtime.stopping.set()
        return await asyncio.wait_for(serving, 1.0)

    assert asyncio.run(scenario()) is False


def test_parallel_pods_take_the_sizes_from_flags_and_variables() -> None:
    argv = ["--tensor-parallel-size", "2", "--kv-port", "7000"]
    config = parse_pod_config("decode", argv, with_receiver=True, environ={"PDSERVE_PIPELINE_PARALLEL_SIZE": "3"})
    assert (config.engine.parallel.tensor_parallel_size, config.engine.parallel.pipeline_parallel_size) == (2, 3)


def test_speculation_with_parallel_sizes_is_a_usage_error_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--pipeline-parallel-size", "2", "--speculative-config", '{"method": "ngram"}']
    with pytest.raises(SystemExit) as exc:
        parse_pod_config("decode", argv, with_receiver=True, environ={})
    assert exc.value.code == 2
    assert "speculative_config: runs on one device only" in capsys.readouterr().err


def test_the_in_process_backend_is_a_usage_error_for_pods(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_pod_config("decode", ["--kv-transfer-backend", "in_process"], with_receiver=True, environ={})
    assert exc.value.code == 2
    assert "--kv-transfer-backend: in_process moves KV within one process" in capsys.readouterr().err
