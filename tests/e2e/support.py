"""Helpers of the end-to-end tests: run one Generate call to the end and keep what the tests check."""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cli.cluster_config import ClusterConfig
from client.generation_client import GenerationClient
from common.sampling_params import SamplingParams
from engine.outputs import CompletionOutput
from pdserve.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2

BLOCK_SIZE = 16
REQUEST_TIMEOUT_S = 120.0
HEARTBEAT_S = 0.2
POD_ARGS = ("--heartbeat-s", str(HEARTBEAT_S), "--num-blocks", "512", "--long-prefill-token-threshold", "64")
"""Flags of every test pod: a fast heartbeat (the registry shows load within HEARTBEAT_S), a small pool, and
chunked prefill (long prompts ship KV chunk by chunk, and no engine step outlasts the registry TTL). NOTE: with
the cluster's pods sharing 2 cores (one thread each), a 256-token chunk of SmolLM2 takes 2-3.5 s and an abort
waits for the step in flight; 64-token chunks keep every step, and so the cancellation bound, under a second."""
REGISTRY_REFRESH_S = 0.2
STARTUP_TIMEOUT_S = 240.0
PREFIX_TOKENS = 512
MIN_CACHED = PREFIX_TOKENS - BLOCK_SIZE

Prompt = str | list[int]


def cluster_config(log_dir: Path, *pod_args: str, **fields: Any) -> ClusterConfig:
    """A LocalCluster for the tests: one prefill and one decode pod, free ports, POD_ARGS then `pod_args` for every
    pod, the tests' registry refresh and start-up timeout, no /metrics; `fields` set any other ClusterConfig field."""
    base = ClusterConfig(
        port=0,
        registry_refresh_s=REGISTRY_REFRESH_S,
        pod_args=(*POD_ARGS, *pod_args),
        log_dir=log_dir,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        metrics_port=None,
    )
    return dataclasses.replace(base, **fields)


class Oracle:
    """Greedy completions of the offline engine (`engine.LLM`) in the test process, memoised."""

    def __init__(self) -> None:
        # NOTE: imported here, so the tests that need no oracle never load torch.
        import torch

        from engine.llm import LLM

        # NOTE: one thread: on a shared 2-core machine torch's spinning thread pool runs many times slower.
        torch.set_num_threads(1)
        self._llm = LLM(num_blocks=1024)
        self._cache: dict[tuple[str | tuple[int, ...], int], CompletionOutput] = {}

    def encode(self, text: str) -> list[int]:
        token_ids: list[int] = self._llm.tokenizer.encode(text)
        return token_ids

    def greedy(self, prompts: Sequence[Prompt], max_tokens: int) -> list[CompletionOutput]:
        """Each prompt's greedy completion (temperature 0, `max_tokens`), in prompt order."""
        keys = [(p if isinstance(p, str) else tuple(p), max_tokens) for p in prompts]
        todo = list(dict.fromkeys(key for key in keys if key not in self._cache))
        if todo:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            prompt_list: list[Prompt] = [p if isinstance(p, str) else list(p) for p, _ in todo]
            outputs = self._llm.generate(prompt_list, params, use_tqdm=False)
            for key, output in zip(todo, outputs, strict=True):
                self._cache[key] = output.outputs[0]
        return [self._cache[key] for key in keys]

    def completions(self, prompt: str, params: SamplingParams) -> list[CompletionOutput]:
        """The offline engine's completions of `prompt` (e.g. a beam search's beams, best first)."""
        return self._llm.generate(prompt, params, use_tqdm=False)[0].outputs


@dataclass(slots=True)
class Completion:
    """Everything one Generate stream returned."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: int = sampling_pb2.FINISH_REASON_UNSPECIFIED
    usage: sampling_pb2.Usage = field(default_factory=sampling_pb2.Usage)
    metrics: generation_pb2.RequestMetrics = field(default_factory=generation_pb2.RequestMetrics)
    num_messages: int = 0
    first_token_ids: list[int] = field(default_factory=list)
    """Token ids of the first message that carried any."""
    message_times: list[float] = field(default_factory=list)
    """time.monotonic() at each message's arrival."""


def run(client: GenerationClient, timeout_s: float = REQUEST_TIMEOUT_S, **kwargs: Any) -> Completion:
    """One Generate call, read to its end (kwargs as GenerationClient.generate)."""
    completion = Completion()
    for response in client.generate(timeout_s=timeout_s, **kwargs):
        completion.message_times.append(time.monotonic())
        completion.num_messages += 1
        if response.token_ids and not completion.first_token_ids:
            completion.first_token_ids = list(response.token_ids)
        completion.token_ids.extend(response.token_ids)
        completion.text += response.text
        if response.finish_reason != sampling_pb2.FINISH_REASON_UNSPECIFIED:
            completion.finish_reason = response.finish_reason
        if response.HasField("usage"):
            completion.usage = response.usage
        if response.HasField("metrics"):
            completion.metrics = response.metrics
    return completion


def run_concurrently(client: GenerationClient, requests: Sequence[Mapping[str, Any]]) -> list[Completion]:
    """`run` every request (kwargs of GenerationClient.generate) at once, each on its own thread; results in
    request order (the first failure is raised)."""
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [pool.submit(run, client, **request) for request in requests]
        return [future.result() for future in futures]


def up_env(runtime_dir: Path) -> dict[str, str]:
    """This process's environment for a `pdserve up` or `pdserve status` subprocess, less PDSERVE_REDIS_URL, with
    XDG_RUNTIME_DIR `runtime_dir`: where `pdserve up` leaves the note that `pdserve status` finds it by, apart from
    any other `pdserve up` on the machine."""
    env = {name: value for name, value in os.environ.items() if name != "PDSERVE_REDIS_URL"}
    return {**env, "XDG_RUNTIME_DIR": str(runtime_dir)}


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def num_blocks(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


def token_prefix(seed: int) -> list[int]:
    """512 token ids drawn from ordinary vocabulary, different for each seed."""
    rng = random.Random(seed)
    return [rng.randrange(1_000, 30_000) for _ in range(PREFIX_TOKENS)]


def with_suffix(prefix: list[int], i: int) -> list[int]:
    return [*prefix, 5_000 + i, 6_000 + i, 7_000 + i]


def sequential(client: GenerationClient, prefix: list[int], count: int, start: int = 0) -> list[Completion]:
    return [run(client, token_ids=with_suffix(prefix, start + i), max_tokens=2, temperature=0.0) for i in range(count)]


def channels_to_each_worker(address: str, num_workers: int, timeout_s: float = 60.0) -> dict[int, grpc.Channel]:
    """A channel to each process of a router of `num_workers` (`--workers`), by worker index, each its own
    connection: fresh connections until every worker answered one's GetLoad (the kernel hands each connection to a
    worker by a hash of it), or `timeout_s` passed; the caller closes them."""
    found: dict[int, grpc.Channel] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < num_workers and time.monotonic() < deadline:
        # NOTE: a local subchannel pool: channels to one address otherwise share one connection, so one worker.
        channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        load = generation_pb2_grpc.GenerationServiceStub(channel).GetLoad(generation_pb2.GetLoadRequest(), timeout=10)
        if load.router_worker in found:
            channel.close()
            time.sleep(0.01)
        else:
            found[load.router_worker] = channel
    return found
