"""The engine's step thread runs nicer than the pod's other threads (`--engine-nice`; default 10 on a CPU engine, 0 on
a GPU), so that on a shared CPU host its matrix work yields to the gRPC threads that answer refusals and aborts."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

from common.errors import InvalidArgumentError
from engine.async_engine import AsyncEngine
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from pod.config import PodServerConfig, parse_pod_config
from tests.engine.model_factory import save_tiny_model


def _thread_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_default_is_10_on_a_cpu_engine_and_0_on_a_gpu() -> None:
    default = PodServerConfig()
    assert (default.engine_nice_on("cpu"), default.engine_nice_on("cuda:0")) == (10, 0)
    assert PodServerConfig(engine_nice=0).engine_nice_on("cpu") == 0
    assert PodServerConfig(engine_nice=3).engine_nice_on("cuda:0") == 3


def test_the_flag_and_its_bounds() -> None:
    config = parse_pod_config("decode", ["--engine-nice", "5"], with_receiver=True, environ={})
    assert config.server.engine_nice == 5
    for bad in (-1, 20):
        with pytest.raises(InvalidArgumentError, match=rf"engine_nice: must be in \[0, 19\], got {bad}"):
            PodServerConfig(engine_nice=bad)


@pytest.mark.skipif(sys.platform != "linux", reason="niceness is per thread only on Linux")
@pytest.mark.parametrize("nice", [0, 3])
def test_the_engine_thread_alone_runs_nicer(tmp_path: Path, nice: int) -> None:
    engine = LLMEngine(engine_config(str(save_tiny_model("qwen3", tmp_path)), num_blocks=16))
    caller = _thread_niceness()

    async def engine_thread_niceness() -> int:
        async_engine = AsyncEngine(engine, nice=nice)
        async_engine.start()
        try:
            return await async_engine.call(lambda _: _thread_niceness())
        finally:
            async_engine.stop()

    assert asyncio.run(engine_thread_niceness()) == min(caller + nice, 19)
    assert _thread_niceness() == caller
