"""The router's CPU per stream, without GPUs: the real router (`python -m router`, `--workers N`) between stand-in
pods that answer at once (`bench.online.standin_pods`: Prefill's first token and TransferDone at once, decode on an
engine-like step clock, one DecodeStream message per step) and closed-loop clients in processes of their own.

Reported per run (JSON on stdout, or --json): completed streams, streams/s, and the CPU milliseconds per stream of
the router's serving processes alone (the process itself, or its workers and supervisor with --workers > 1; not the
tokenizer workers, reported apart), read from /proc between the start and the end of the measured phase; the
clients' and the pods' CPU per stream beside it, to tell whether the router was the bottleneck.

    python -m bench.online.router_cpu [--workers 1] [--concurrency 32] [--num-prompts 2000] \
        [--input-len 128] [--output-len 32] [--client-procs 2] [--step-ms 4]

A CPU-only measure of the router's work per stream; on a machine with fewer cores than router + pods + clients need,
streams/s says little, CPU per stream still does (within a few percent: the processes share caches and cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.online.cluster_target import write_synthetic_tokenizer
from bench.online.load_driver import RunResult, merge, run_closed_loop
from bench.online.process_cpu import CpuSnapshot
from bench.online.router_client import RouterTarget
from bench.workloads import RequestSpec
from cli.redis_server import RedisServer
from router.pods.pod_client import PodClient

MODEL = "shape:qwen3-0.6b"
_VOCAB = 4096
"""Words of the synthetic tokenizer (prompts draw from them; the router's model info keeps the shape's vocab)."""


@dataclass(frozen=True, slots=True)
class ClientJob:
    address: str
    texts: tuple[str, ...]
    output_len: int
    concurrency: int
    num_connections: int
    id_prefix: str


def _run_client(job: ClientJob) -> tuple[RunResult, float]:
    """One client process's closed loop; returns its run and its own CPU seconds during it."""
    started = time.process_time()
    result = asyncio.run(_client(job))
    return result, time.process_time() - started


async def _client(job: ClientJob) -> RunResult:
    async with RouterTarget(job.address, 120.0, job.num_connections) as router:
        return await run_closed_loop(
            lambda i: router.generate(RequestSpec([], job.output_len), f"{job.id_prefix}-{i}", job.texts[i]),
            len(job.texts),
            job.concurrency,
            job.id_prefix,
            show_progress=False,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )


def _wait_for_line(process: subprocess.Popen[bytes], log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{process.args!r} did not print {text!r}: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


async def _wait_serving(address: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    router = PodClient("router", address)
    try:
        while not await router.is_serving(1.0):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router at {address} is not SERVING after {timeout_s} s")
            await asyncio.sleep(0.2)
    finally:
        await router.aclose()


@contextlib.contextmanager
def _cluster(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], list[int]]]:
    """Redis, the stand-in pods and the router; yields the router's address, its process and the pods' pids."""
    processes: list[subprocess.Popen[bytes]] = []
    with RedisServer() as redis:
        try:
            logs = [workdir / f"{role}-{i}.log" for i in range(args.num_pods) for role in ("prefill", "decode")]
            for log in logs:
                role, pod_id = log.stem.split("-")[0], log.stem
                command = [sys.executable, "-m", "bench.online.standin_pods", "--role", role, "--pod-id", pod_id]
                command += ["--redis-url", redis.url, "--model", MODEL, "--step-ms", str(args.step_ms)]
                processes.append(_start(command, log))
            for process, log in zip(processes, logs, strict=True):
                _wait_for_line(process, log, "serving on", 60)
            tokenizer = write_synthetic_tokenizer(workdir / "tokenizer", _VOCAB)
            address = f"127.0.0.1:{_free_port()}"
            command = [sys.executable, "-m", "router", "--port", address.rsplit(":", 1)[1], "--redis-url", redis.url]
            command += ["--model", MODEL, "--tokenizer", str(tokenizer), "--workers", str(args.workers)]
            command += ["--registry-refresh-s", "0.5", *args.router_arg]
            router = _start(command, workdir / "router.log")
            processes.append(router)
            asyncio.run(_wait_serving(address, 120))
            yield address, router, [p.pid for p in processes[:-1]]
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)


def _router_pids(router_pid: int, snapshot: CpuSnapshot) -> list[int]:
    """The router's serving processes: itself, and its workers when it supervises some (not tokenizer workers)."""
    pids = [router_pid]
    for pid, parent in snapshot.parents.items():
        if parent == router_pid:
            with contextlib.suppress(OSError):
                if b"router.processes.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(pid)
    return pids


def _texts(num: int, input_len: int, seed: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(" ".join(f"t{rng.randrange(1, _VOCAB)}" for _ in range(input_len)) for _ in range(num))


def _jobs(args: argparse.Namespace, address: str, num: int, seed: int, prefix: str) -> list[ClientJob]:
    texts = _texts(num, args.input_len, seed)
    procs = args.client_procs
    per_proc = [args.concurrency // procs + (k < args.concurrency % procs) for k in range(procs)]
    return [
        ClientJob(address, texts[k::procs], args.output_len, per_proc[k], args.connections, f"{prefix}-{k}")
        for k in range(procs)
        if per_proc[k]
    ]


def _num_messages(run: RunResult) -> int:
    """Messages that carried tokens, over the completed streams (each message stamps its tokens with one time)."""
    return sum(len(set(record.timing.token_times)) for record in run.completed)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="router-cpu-") as tmp, _cluster(args, Path(tmp)) as (address, router, pods):
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.client_procs, mp_context=context) as pool:
            warmup = _jobs(args, address, args.warmup_prompts, 1, "warmup")
            list(pool.map(_run_client, warmup))
            jobs = _jobs(args, address, args.num_prompts, 2, "run")
            before = CpuSnapshot.take()
            outcomes = list(pool.map(_run_client, jobs))
            after = CpuSnapshot.take()
        run = merge([result for result, _ in outcomes])
        completed = len(run.completed)
        router_pids = _router_pids(router.pid, after)
        router_s = sum(after.own(pid) - before.own(pid) for pid in router_pids)
        tree_s = after.tree(router.pid) - before.tree(router.pid)
        per_stream = 1000 / max(completed, 1)
        return {
            "workers": args.workers,
            "concurrency": args.concurrency,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "step_ms": args.step_ms,
            "num_pods": args.num_pods,
            "client_procs": args.client_procs,
            "completed": completed,
            "failed": run.num_failed,
            "errors": sorted({r.error for r in run.records if r.error})[:5],
            "wall_s": round(run.duration_s, 3),
            "client_messages_per_stream": round(_num_messages(run) / max(completed, 1), 2),
            "streams_per_s": round(completed / run.duration_s, 1),
            "router_cpu_ms_per_stream": round(router_s * per_stream, 3),
            "router_cores": round(router_s / run.duration_s, 2),
            "tokenizer_cpu_ms_per_stream": round((tree_s - router_s) * per_stream, 3),
            "client_cpu_ms_per_stream": round(sum(cpu for _, cpu in outcomes) * per_stream, 3),
            "pods_cpu_ms_per_stream": round(sum(after.own(p) - before.own(p) for p in pods) * per_stream, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="router processes (--workers of the router)")
    parser.add_argument("--concurrency", type=int, default=32, help="streams open at once (closed loop)")
    parser.add_argument("--num-prompts", type=int, default=2000)
    parser.add_argument("--warmup-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--connections", type=int, default=4, help="connections to the router per client process")
    parser.add_argument("--num-pods", type=int, default=1, help="stand-in prefill pods, and as many decode pods")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the stand-in decode pod's step period")
    parser.add_argument("--router-arg", action="append", default=[], help="one more router flag (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = measure(args)
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
