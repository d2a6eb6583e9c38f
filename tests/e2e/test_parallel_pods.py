"""Tensor-parallel pods end to end: a TP=2 prefill pod and a TP=2 decode pod (two gloo worker processes each) serve
through the router token-identically to the colocated one-device engine, their KV shipped rank to rank over tcp;
the registry shows their sizes. PP=2 and TP=2 x PP=2 pairs likewise (soak: not in the default run). On two GPUs (gpu
marker), the TP=2 pair over cuda_ipc and nccl. The fault path (slow): kill -9 one worker of the decode pod that
streams; the pod leaves routing and its requests migrate to the other TP=2 decode pod.

The model is the random tiny Llama of the parallel engine tests (4 heads, 2 KV heads), with SmolLM2's tokenizer
files beside it for the router (prompts are token ids below the tiny vocabulary).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig
from client.generation_client import GenerationClient
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.e2e.support import cluster_config, run
from tests.engine.model_factory import save_tiny_model
from tests.engine.quant_support import greedy
from tests.faults.support import (
    Stream,
    join_streams,
    log_errors,
    pods_of,
    random_prompt,
    seconds_until,
    start_streams,
)
from tests.kv_transfer.backends import needs_two_gpus

NUM_TOKENS = 16
TP2 = ("--tensor-parallel-size", "2")
# NOTE: lengths past one 64-token chunk, so the KV of long prompts ships chunk by chunk, rank to rank.
PROMPTS = [[t % 512 for t in random_prompt(seed, n)] for seed, n in ((1, 5), (2, 40), (3, 150), (4, 90))]
LONG_TOKENS = 200


def _tiny_model(name: str, folder: Path, smollm2_path: Path) -> Path:
    """A random tiny model of `name` (tests.engine.model_factory) with SmolLM2's tokenizer files, for the router."""
    save_tiny_model(name, folder)
    for file_name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_path / file_name, folder / file_name)
    return folder


def _pair_config(model: Path, log_dir: Path, *pod_args: str, **options: Any) -> ClusterConfig:
    """One prefill and one decode pod of `model` with the e2e pods' flags and `pod_args`."""
    return cluster_config(log_dir, *pod_args, model=str(model), **options)


def _serve(cluster: LocalCluster, prompts: list[list[int]]) -> list[Stream]:
    """Every prompt's greedy stream through the router, run to the end."""
    with GenerationClient(cluster.router_address) as pair_client:
        streams = start_streams(pair_client, [_request(prompt) for prompt in prompts])
        join_streams(streams, timeout_s=300.0)
    return streams


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    return _tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"), smollm2_path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> Iterator[LocalCluster]:
    with LocalCluster(_pair_config(tiny_llama, tmp_path_factory.mktemp("tp-pods-logs"), *TP2)) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[GenerationClient]:
    with GenerationClient(cluster.router_address) as generation_client:
        yield generation_client


@pytest.fixture(scope="module")
def colocated_engine(tiny_llama: Path) -> LLMEngine:
    return LLMEngine(engine_config(str(tiny_llama), num_blocks=64))


@pytest.fixture(scope="module")
def colocated(colocated_engine: LLMEngine) -> list[list[int]]:
    """The one-device engine's greedy outputs over PROMPTS (EOS ignored, as the requests do)."""
    return greedy(colocated_engine, PROMPTS, NUM_TOKENS)


def _request(prompt: list[int], max_tokens: int = NUM_TOKENS) -> dict[str, object]:
    return {"token_ids": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


def test_tp2_pod_pair_serves_token_identically_to_the_colocated_engine(
    cluster: LocalCluster, client: GenerationClient, colocated: list[list[int]]
) -> None:
    assert [(pod.role, pod.tensor_parallel_size, pod.pipeline_parallel_size) for pod in cluster.pod_infos()] == [
        ("decode", 2, 1),
        ("prefill", 2, 1),
    ]
    streams = _serve(cluster, PROMPTS)
    assert [s.error for s in streams] == [None] * len(PROMPTS)
    assert [s.token_ids for s in streams] == colocated
    assert all(s.num_attempts == 1 for s in streams)


@pytest.mark.soak  # two more clusters, ~25 s of CPU: not in the default run
@pytest.mark.parametrize(("arch", "sizes"), [("qwen3", (1, 2)), ("llama", (2, 2))], ids=["pp2-qwen3", "tp2xpp2-llama"])
def test_pipeline_parallel_pod_pairs_serve_token_identically(
    tmp_path: Path, smollm2_path: Path, arch: str, sizes: tuple[int, int]
) -> None:
    """PP=2 (one layer per stage) and TP=2 x PP=2 (four workers per pod, four transfers per chunk)."""
    model = _tiny_model(arch, tmp_path / arch, smollm2_path)
    expected = greedy(LLMEngine(engine_config(str(model), num_blocks=64)), PROMPTS, NUM_TOKENS)
    flags = ("--tensor-parallel-size", str(sizes[0]), "--pipeline-parallel-size", str(sizes[1]))
    with LocalCluster(_pair_config(model, tmp_path / "logs", *flags)) as local:
        assert {(pod.tensor_parallel_size, pod.pipeline_parallel_size) for pod in local.pod_infos()} == {sizes}
        streams = _serve(local, PROMPTS)
    assert [s.error for s in streams] == [None] * len(PROMPTS)
    assert [s.token_ids for s in streams] == expected


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("backend", ["cuda_ipc", "nccl"])
def test_tp2_pod_pair_on_two_gpus_ships_kv_rank_to_rank(
    tmp_path: Path, tiny_llama: Path, backend: str, record_property: pytest.RecordProperty
) -> None:
    """`--gpus 0,1`: the prefill pod's rank r runs on GPU r, the decode pod's on GPU 1 - r (its CUDA_VISIBLE_DEVICES
    is "1,0"), so each rank's transfer crosses GPUs; cuda_ipc reads pools the workers exported."""
    expected = greedy(LLMEngine(engine_config(str(tiny_llama), dtype="float32", num_blocks=64)), PROMPTS, NUM_TOKENS)
    config = _pair_config(
        tiny_llama, tmp_path, *TP2, "--dtype", "float32", kv_transfer_backend=backend, gpus=("0", "1")
    )
    with LocalCluster(config) as local:
        streams = _serve(local, PROMPTS)
        errors = log_errors(local)
    record_property("log_errors", errors)
    assert [s.error for s in streams] == [None] * len(PROMPTS), errors
    assert [s.token_ids for s in streams] == expected


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _worker_pids(pod_pid: int) -> list[int]:
    """The pod's engine workers: the processes that multiprocessing spawned under its engine core process (not its
    resource tracker)."""
    descendants, frontier = [], _children(pod_pid)
    while frontier:
        descendants += frontier
        frontier = [child for pid in frontier for child in _children(pid)]
    cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in descendants}
    return sorted(pid for pid, cmdline in cmdlines.items() if b"spawn_main" in cmdline)


def _busy_decode_pod(cluster: LocalCluster) -> str | None:
    busy = [pod.pod_id for pod in pods_of(cluster, "decode") if pod.num_running > 0]
    return busy[0] if len(busy) == 1 else None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killing_one_worker_of_a_tp_decode_pod_takes_it_out_and_its_requests_migrate(
    cluster: LocalCluster, client: GenerationClient, colocated_engine: LLMEngine, colocated: list[list[int]]
) -> None:
    (long_expected,) = greedy(colocated_engine, [PROMPTS[2]], LONG_TOKENS)
    cluster.add_pod("decode")
    one = Stream(_request(PROMPTS[2], LONG_TOKENS)).start(client)
    assert seconds_until(lambda: _busy_decode_pod(cluster) is not None, 60.0) is not None
    victim = _busy_decode_pod(cluster)
    assert victim is not None
    others = start_streams(client, [_request(prompt) for prompt in PROMPTS])
    assert seconds_until(lambda: len(one.token_ids) >= 4, 60.0) is not None
    workers = _worker_pids(cluster.pods[victim].pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)

    assert seconds_until(lambda: victim not in [pod.pod_id for pod in cluster.pod_infos()], 30.0) is not None
    join_streams([one, *others], timeout_s=300.0)
    assert [s.error for s in [one, *others]] == [None] * (1 + len(PROMPTS))
    assert [s.token_ids for s in others] == colocated
    assert one.num_attempts >= 2 and one.token_ids == long_expected
    assert cluster.pods[victim].wait_or_kill(30.0) == 1
    assert run(client, **_request(PROMPTS[0])).token_ids == colocated[0]
