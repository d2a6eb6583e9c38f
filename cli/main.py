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
                                               (no --redis-url: the cluster `pdserve up` runs on this machine)
pdserve credentials DIR                    (a throwaway CA, certificates, token, Redis password: compose, k8s)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from autoscaler import commands as autoscale
from cli.credentials import add_credentials_parser
from cli.generate_command import TOKEN_VARIABLE, add_generate_parser
from cli.health import DEFAULT_TIMEOUT_S, check_health
from cli.up_command import Commands, add_up_parser
from common.errors import UnavailableError
from common.tls import INTERNAL_SERVER_NAME, client_security

_SERVICE_MAINS = {
    "router": ("router.__main__", "the public router (GenerationService)"),
    "prefill": ("prefill_service.__main__", "one prefill pod"),
    "decode": ("decode_service.__main__", "one decode pod"),
    "bench": (
        "bench.__main__",
        "the benchmark workloads: offline, KV transfer, online",
    ),
}
_REDIS_URL_VARIABLE = "PDSERVE_REDIS_URL"


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
    parser = argparse.ArgumentParser(
        prog="pdserve",
        description="Disaggregated LLM serving: router, prefill and "
        "decode pods over gRPC, with a Redis prefix directory.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_up_parser(commands)
    autoscale.add_autoscale_parser(commands)
    for name, (_, summary) in _SERVICE_MAINS.items():
        commands.add_parser(name, add_help=False, help=f"run {summary}; `pdserve {name} --help` for its flags")
    add_generate_parser(commands)
    _add_health(commands)
    _add_status(commands)
    add_credentials_parser(commands)
    return parser


def _add_health(commands: Commands) -> None:
    health = commands.add_parser(
        "health",
        help="exit 0 if a server's grpc.health.v1 says SERVING (for probes)",
        description="One grpc.health.v1 Check: exit 0 on SERVING; otherwise print why "
        "(NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN, UNREACHABLE) and exit 1.",
    )
    health.add_argument("address", help="host:port of the router or of a pod")
    health.add_argument("--service", default="", help='the service to ask about (default: "", the whole server)')
    health.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"give up (UNREACHABLE) after this long (default: {DEFAULT_TIMEOUT_S})",
    )
    health.add_argument("--tls-ca", help="dial over TLS, verifying the server against this PEM CA")
    health.add_argument("--tls-cert", help="client certificate (a pod with mTLS on: one its cluster CA signed)")
    health.add_argument("--tls-key", help="private key of --tls-cert")
    health.add_argument(
        "--token",
        default=os.environ.get(TOKEN_VARIABLE),
        help=f"bearer token, if health needs one (default: env {TOKEN_VARIABLE})",
    )
    health.set_defaults(func=_health)


def _add_status(commands: Commands) -> None:
    status = commands.add_parser(
        "status",
        help="list the registered pods (state, load, KV use) and routers' health",
        description="Every pod in the Redis pod registry, as of its last heartbeat; "
        "routers do not register: name them with --router to see their health. Without "
        "--redis-url: the pods and the router of the cluster that `pdserve up` runs on this "
        "machine.",
    )
    status.add_argument(
        "--redis-url",
        default=os.environ.get(_REDIS_URL_VARIABLE),
        help=f"the registry (default: env {_REDIS_URL_VARIABLE}, else the Redis of the cluster that "
        "`pdserve up` runs on this machine)",
    )
    status.add_argument(
        "--router",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="host:port of a router to health-check (repeatable; default: none, or the router of the "
        "`pdserve up` cluster)",
    )
    status.add_argument("--json", action="store_true", help="print JSON (stable keys) instead of a table")
    status.add_argument("--tls-ca", help="dial the routers over TLS, verifying them against this PEM CA")
    status.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"bound of each Redis and health call (default: {DEFAULT_TIMEOUT_S})",
    )
    status.set_defaults(func=_status)


def _run_service(name: str, argv: list[str]) -> int:
    # NOTE: imported here, so `pdserve --help` and `pdserve up` work whatever state the services are in.
    module = importlib.import_module(_SERVICE_MAINS[name][0])
    code = module.main(argv)
    return int(code or 0)


def _health(args: argparse.Namespace, extra: list[str]) -> int:
    # NOTE: with a client certificate the server is a pod, whose certificate names the cluster, not its address.
    server_name = INTERNAL_SERVER_NAME if args.tls_cert else None
    security = client_security(args.tls_ca, args.tls_cert, args.tls_key, server_name)
    check = asyncio.run(check_health(args.address, args.service, args.timeout_s, security, args.token))
    print(check.describe(), file=sys.stdout if check.serving else sys.stderr)
    return 0 if check.serving else 1


def _status(args: argparse.Namespace, extra: list[str]) -> int:
    from cli.running_cluster import notes_folder, the_running_cluster
    from cli.status import read_status, to_json, to_table

    redis_url, routers, tls_ca = args.redis_url, args.router, args.tls_ca
    try:
        if redis_url is None:
            local = the_running_cluster(notes_folder(os.environ))
            redis_url, routers, tls_ca = local.redis_url, routers or [local.router_address], tls_ca or local.tls_ca
        status = asyncio.run(read_status(redis_url, routers, args.timeout_s, client_security(tls_ca)))
    except UnavailableError as exc:
        print(f"pdserve status: {exc}", file=sys.stderr)
        return 1
    print(to_json(status) if args.json else to_table(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
