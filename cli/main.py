"""The `pdserve` command: a local cluster in one command, each service on its own, and a streaming client.

pdserve up [--prefill N] [--decode M] [--port 50051] [--http-port 8000] [--redis-url URL] [--metrics-port 9100]
           [--gpus 0,1,...] [--otlp-endpoint URL] [--secure [--secure-dir DIR]] [--autoscale [--min-prefill N ...]]
           [pod flags ...]
pdserve autoscale --redis-url URL [--connector kubernetes|compose] [--min-prefill N --max-prefill N ...]
pdserve router|prefill|decode [flags]      (`pdserve router --help` lists the service's flags)
pdserve bench --workload w1..w9|w2online|idle [--model-shape qwen3-8b] [...]   (`--workload NAME --help`)
pdserve generate "prompt" [--address localhost:50051] [--max-tokens 64] [--temperature T] [--chat]
                 [--token T | env PDSERVE_TOKEN] [--tls-ca ca.pem]
pdserve health ADDRESS [--service NAME] [--timeout-s 2] [--tls-ca ca.pem [--tls-cert c.pem --tls-key k.pem]]
                                                              (exit 0 when SERVING: container and k8s probes)
pdserve status [--redis-url URL] [--router ADDRESS ...] [--json] [--tls-ca ca.pem]
pdserve credentials DIR                    (a throwaway CA, certificates, token, Redis password: compose, k8s)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TypeAlias, cast

import grpc

from cli.autoscaler import commands as autoscale
from cli.client import generate
from cli.cluster_config import DEFAULT_METRICS_PORT, ClusterConfig, parse_gpus, visible_gpus
from cli.credentials import ClusterCredentials, add_credentials_parser
from cli.health import DEFAULT_TIMEOUT_S, check_health
from cli.service_process import ClusterError
from common.config import ConfigValueError
from common.errors import InvalidArgumentError, UnavailableError
from common.grpc_errors import bad_request_fields
from common.tls import INTERNAL_SERVER_NAME, client_security
from engine.config import DEFAULT_MODEL
from pdserve.v1 import generation_pb2, sampling_pb2

_SERVICE_MAINS = {
    "router": ("router.__main__", "the public router (GenerationService)"),
    "prefill": ("prefill_service.__main__", "one prefill pod"),
    "decode": ("decode_service.__main__", "one decode pod"),
    "bench": (
        "bench.__main__",
        "the benchmark workloads: offline, KV transfer, online",
    ),
}
_UP_FLAGS = {"num_prefill": "prefill", "num_decode": "decode"}
_NO_METRICS = -1
_WATCH_INTERVAL_S = 0.5
_EXIT_INTERRUPTED = 130
_DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_TOKEN_VARIABLE = "PDSERVE_TOKEN"
_REDIS_URL_VARIABLE = "PDSERVE_REDIS_URL"

_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pdserve` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _SERVICE_MAINS:
        return _run_service(args[0], args[1:])
    parser = _parser()
    parsed, extra = parser.parse_known_args(args)
    if parsed.command != "up" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command: Callable[[argparse.Namespace, list[str]], int] = parsed.func
    return command(parsed, extra)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description="Disaggregated LLM serving: router, prefill and "
                                     "decode pods over gRPC, with a Redis prefix directory.")  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_up(commands)
    autoscale.add_autoscale_parser(commands)
    for name, (_, summary) in _SERVICE_MAINS.items():
        commands.add_parser(name, add_help=False, help=f"run {summary}; `pdserve {name} --help` for its flags")
    _add_generate(commands)
    _add_health(commands)
    _add_status(commands)
    add_credentials_parser(commands)
    return parser


def _add_up(commands: _Commands) -> None:
    up = commands.add_parser("up", allow_abbrev=False, help="run Redis, the pods and the router locally",
                             description="Run a local cluster until Ctrl-C. Flags not listed here go to every "
                             "pod (engine flags such as --num-blocks, --max-num-seqs, --heartbeat-s).")  # fmt: skip
    up.add_argument("--prefill", type=int, default=1, help="number of prefill pods (default: 1)")
    up.add_argument("--decode", type=int, default=1, help="number of decode pods (default: 1)")
    up.add_argument("--host", default="127.0.0.1", help="interface every process binds (default: 127.0.0.1)")
    up.add_argument("--port", type=int, default=50051, help="the router's port (default: 50051)")
    up.add_argument("--http-port", type=int, default=8000, help="the router's OpenAI-compatible HTTP API; 0: off "
                    "(default: 8000)")  # fmt: skip
    up.add_argument("--redis-url", help="use this Redis instead of starting a throwaway redis-server")
    up.add_argument("--model", default=DEFAULT_MODEL, help=f"model of every pod (default: {DEFAULT_MODEL})")
    up.add_argument("--kv-transfer-backend", default="tcp", help="tcp, cuda_ipc, nccl or in_process (default: tcp)")
    up.add_argument("--registry-refresh-s", type=float, default=1.0, help="router's pod discovery period")
    up.add_argument("--log-dir", type=Path, help="folder of the processes' logs (default: a new temp folder)")
    up.add_argument("--startup-timeout-s", type=float, default=600.0, help="give up if not serving by then")
    up.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                    help=f"/metrics of the router; the first prefill and decode pods take the next two ports, "
                    f"further pods free ones; 0: free ports for all, {_NO_METRICS}: none (default: "
                    f"{DEFAULT_METRICS_PORT})")  # fmt: skip
    up.add_argument("--otlp-endpoint", help="OTLP collector for every process's traces (default: tracing off)")
    up.add_argument("--gpus", help="GPU ids to spread the pods over, comma-separated: one GPU per pod where they "
                    "fit (prefill pods, then decode pods, round-robin), as each pod's CUDA_VISIBLE_DEVICES; 'none': "
                    "leave it as is (default: every visible GPU: CUDA_VISIBLE_DEVICES, else nvidia-smi; none on a "
                    "CPU host)")  # fmt: skip
    up.add_argument("--secure", action="store_true",
                    help="bearer tokens + TLS on the router, mTLS router->pods and on KV sockets, Redis password + "
                    "TLS: throwaway CA, certificates and token made in --secure-dir (default: off)")  # fmt: skip
    up.add_argument("--secure-dir", type=Path, help="where --secure writes them (default: <log dir>/secure)")
    autoscale.add_up_flags(up)
    up.set_defaults(func=_up)


def _add_generate(commands: _Commands) -> None:
    gen = commands.add_parser("generate", help="stream one completion from a running router")
    gen.add_argument("prompt", help="the prompt text (with --chat: one user message)")
    gen.add_argument("--address", default="localhost:50051", help="the router (default: localhost:50051)")
    gen.add_argument("--chat", action="store_true", help="send the prompt as a chat message (chat template)")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate (default: 64)")
    gen.add_argument("--temperature", type=float, help="0 is greedy (default: the server's, 1.0)")
    gen.add_argument("--top-p", type=float, help="nucleus sampling threshold in (0, 1]")
    gen.add_argument("--top-k", type=int, help="keep only the k most likely tokens")
    gen.add_argument("--seed", type=int, help="seed for reproducible sampling")
    gen.add_argument("--stop", action="append", help="a stop string (repeatable)")
    gen.add_argument("--timeout-s", type=float, help="deadline of the whole request")
    gen.add_argument("--token", default=os.environ.get(_TOKEN_VARIABLE),
                     help=f"bearer token of a router with auth on (default: env {_TOKEN_VARIABLE})")  # fmt: skip
    gen.add_argument("--tls-ca", help="dial the router over TLS, verifying it against this PEM CA")
    gen.set_defaults(func=_generate)


def _add_health(commands: _Commands) -> None:
    health = commands.add_parser("health", help="exit 0 if a server's grpc.health.v1 says SERVING (for probes)",
                                 description="One grpc.health.v1 Check: exit 0 on SERVING; otherwise print why "
                                 "(NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN, UNREACHABLE) and exit 1.")  # fmt: skip
    health.add_argument("address", help="host:port of the router or of a pod")
    health.add_argument("--service", default="", help='the service to ask about (default: "", the whole server)')
    health.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"give up (UNREACHABLE) after this long (default: {DEFAULT_TIMEOUT_S})")  # fmt: skip
    health.add_argument("--tls-ca", help="dial over TLS, verifying the server against this PEM CA")
    health.add_argument("--tls-cert", help="client certificate (a pod with mTLS on: one its cluster CA signed)")
    health.add_argument("--tls-key", help="private key of --tls-cert")
    health.add_argument("--token", default=os.environ.get(_TOKEN_VARIABLE),
                        help=f"bearer token, if health needs one (default: env {_TOKEN_VARIABLE})")  # fmt: skip
    health.set_defaults(func=_health)


def _add_status(commands: _Commands) -> None:
    status = commands.add_parser("status", help="list the registered pods (state, load, KV use) and routers' health",
                                 description="Every pod in the Redis pod registry, as of its last heartbeat; "
                                 "routers do not register: name them with --router to see their health.")  # fmt: skip
    status.add_argument("--redis-url", default=os.environ.get(_REDIS_URL_VARIABLE, _DEFAULT_REDIS_URL),
                        help=f"the registry (default: env {_REDIS_URL_VARIABLE}, or {_DEFAULT_REDIS_URL})")  # fmt: skip
    status.add_argument("--router", action="append", default=[], metavar="ADDRESS",
                        help="host:port of a router to health-check (repeatable)")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print JSON (stable keys) instead of a table")
    status.add_argument("--tls-ca", help="dial the routers over TLS, verifying them against this PEM CA")
    status.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"bound of each Redis and health call (default: {DEFAULT_TIMEOUT_S})")  # fmt: skip
    status.set_defaults(func=_status)


def _run_service(name: str, argv: list[str]) -> int:
    # NOTE: imported here, so `pdserve --help` and `pdserve up` work whatever state the services are in.
    module = importlib.import_module(_SERVICE_MAINS[name][0])
    code = module.main(argv)
    return int(code or 0)


def _up(args: argparse.Namespace, pod_args: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _cluster_config(args, pod_args)
        autoscale_config = autoscale.autoscaler_config(args)
    except ConfigValueError as exc:
        print(f"pdserve up: {exc}", file=sys.stderr)
        return 2
    except InvalidArgumentError as exc:
        print(f"pdserve up: --{_UP_FLAGS.get(exc.field, exc.field)}: {exc.description}", file=sys.stderr)
        return 2
    # NOTE: imported here (and cli.status in _status), so `pdserve health`, run by probes, loads no Redis client.
    from cli.autoscaler.run import start_for_cluster
    from cli.cluster import LocalCluster

    if args.secure:
        config = _secured(config, args.secure_dir)
    cluster = LocalCluster(config)
    autoscaler = None
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    # NOTE: SIGINT too: a shell starting `pdserve up` in the background (no job control) leaves it ignored.
    for sig in handlers:
        signal.signal(sig, _raise_interrupt)
    try:
        cluster.start()
        print(f"pdserve router listening on {cluster.router_address} ({args.prefill} prefill, {args.decode} decode; "
              f"logs in {cluster.log_dir}); Ctrl-C stops everything", flush=True)  # fmt: skip
        for name, url in cluster.metrics_urls.items():
            print(f"  {name} metrics: {url}", flush=True)
        if cluster.http_url is not None:
            print(f"  OpenAI-compatible HTTP API: {cluster.http_url}/v1", flush=True)
        if config.credentials is not None:
            folder = config.credentials.folder
            print(f"  secure: TLS (CA {folder / 'ca.pem'}), bearer token in {folder / 'tokens'}, mTLS inside; "
                  f"pdserve generate --tls-ca {folder / 'ca.pem'} --token \"$(cat {folder / 'tokens'})\" ...",
                  flush=True)  # fmt: skip
        if autoscale_config is not None:
            autoscaler, autoscaler_url = start_for_cluster(autoscale_config, cluster)
            print(f"  autoscaler metrics: {autoscaler_url or 'off'}", flush=True)
        while (exited := cluster.poll_exited()) is None:
            time.sleep(_WATCH_INTERVAL_S)
        print(f"pdserve: {exited.name} exited with code {exited.returncode}; stopping the cluster. Log tail:\n"
              f"{exited.log_tail()}", file=sys.stderr)  # fmt: skip
        return 1
    except ClusterError as exc:
        print(f"pdserve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pdserve: stopping the cluster", file=sys.stderr)
        return 0
    finally:
        # NOTE: a second Ctrl-C must not cut the shutdown short and orphan the pods while they drain.
        for sig in handlers:
            signal.signal(sig, signal.SIG_IGN)
        if autoscaler is not None:
            autoscaler.stop_thread()
        cluster.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _cluster_config(args: argparse.Namespace, pod_args: list[str]) -> ClusterConfig:
    """`pdserve up`'s cluster from its flags; raises InvalidArgumentError naming a bad field."""
    return ClusterConfig(
        num_prefill=args.prefill, num_decode=args.decode, host=args.host, port=args.port, http_port=args.http_port,
        redis_url=args.redis_url, model=args.model, kv_transfer_backend=args.kv_transfer_backend,
        registry_refresh_s=args.registry_refresh_s, pod_args=tuple(pod_args), log_dir=args.log_dir,
        startup_timeout_s=args.startup_timeout_s, show_progress=True,
        metrics_port=None if args.metrics_port == _NO_METRICS else args.metrics_port,
        otlp_endpoint=args.otlp_endpoint,
        gpus=parse_gpus(args.gpus) if args.gpus is not None else visible_gpus(os.environ),
    )  # fmt: skip


def _secured(config: ClusterConfig, folder: Path | None) -> ClusterConfig:
    """`config` with throwaway credentials made in `folder` (default: the log folder's `secure`)."""
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="pdserve-cluster-"))
    credentials = ClusterCredentials.create(folder or log_dir / "secure")
    return dataclasses.replace(config, log_dir=log_dir, credentials=credentials)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _generate(args: argparse.Namespace, extra: list[str]) -> int:
    sampling = {
        name: value
        for name, value in (("max_tokens", args.max_tokens), ("temperature", args.temperature), ("top_p", args.top_p),
                            ("top_k", args.top_k), ("seed", args.seed), ("stop", args.stop))
        if value is not None
    }  # fmt: skip
    prompt = {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {"prompt": args.prompt}
    last: generation_pb2.GenerateResponse | None = None
    try:
        security = client_security(args.tls_ca)
        for response in generate(args.address, timeout_s=args.timeout_s, token=args.token, security=security,
                                 **prompt, **sampling):  # fmt: skip
            sys.stdout.write(response.text)
            sys.stdout.flush()
            last = response
    except grpc.RpcError as exc:
        if last is not None:
            print(flush=True)
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        # NOTE: a sync call's error carries the same trailing metadata, all bad_request_fields reads.
        for field_path, description in bad_request_fields(cast(grpc.aio.AioRpcError, exc)):
            print(f"  {field_path}: {description}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _EXIT_INTERRUPTED
    print(flush=True)
    if last is not None:
        print(_summary(last), file=sys.stderr)
    return 0


def _summary(last: generation_pb2.GenerateResponse) -> str:
    """One line: finish reason, usage, and where and how fast the router served the request."""
    finish = sampling_pb2.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower()
    usage, metrics = last.usage, last.metrics
    line = (f"[finish_reason={finish} prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
            f"cached_prompt_tokens={usage.cached_prompt_tokens}")  # fmt: skip
    if last.HasField("metrics"):
        line += (f" prefill_pod={metrics.prefill_pod_id} decode_pod={metrics.decode_pod_id or '-'} "
                 f"kv_transfer_bytes={metrics.kv_transfer_bytes} "
                 f"ttft_ms={metrics.time_to_first_token.ToMilliseconds()}")  # fmt: skip
    return line + "]"


def _health(args: argparse.Namespace, extra: list[str]) -> int:
    # NOTE: with a client certificate the server is a pod, whose certificate names the cluster, not its address.
    server_name = INTERNAL_SERVER_NAME if args.tls_cert else None
    security = client_security(args.tls_ca, args.tls_cert, args.tls_key, server_name)
    check = asyncio.run(check_health(args.address, args.service, args.timeout_s, security, args.token))
    print(check.describe(), file=sys.stdout if check.serving else sys.stderr)
    return 0 if check.serving else 1


def _status(args: argparse.Namespace, extra: list[str]) -> int:
    from cli.status import read_status, to_json, to_table

    try:
        status = asyncio.run(read_status(args.redis_url, args.router, args.timeout_s, client_security(args.tls_ca)))
    except UnavailableError as exc:
        print(f"pdserve status: {exc}", file=sys.stderr)
        return 1
    print(to_json(status) if args.json else to_table(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
