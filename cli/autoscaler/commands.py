"""The autoscaler's commands: `pdserve autoscale` (a process of its own on a deployment's Redis) and the
autoscaler of `pdserve up --autoscale` (beside the local cluster, in its process). cli/main.py adds the parsers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from types import FrameType

from cli.autoscaler.config import AutoscalerConfig
from cli.autoscaler.connector import KubernetesConnector
from cli.autoscaler.local_connector import LocalConnector
from cli.autoscaler.service import Autoscaler
from cli.cluster import LocalCluster
from common.config import ConfigValueError, add_config_args, config_from_args

logger = logging.getLogger(__name__)

CONNECTORS = ("local", "kubernetes")
DEFAULT_METRICS_PORT = 9100
UP_METRICS_OFFSET = 3
"""`pdserve up --autoscale`: the autoscaler's /metrics port is the cluster's metrics port + 3 (after the router
and the first prefill and decode pods; cli/cluster_config.py)."""


def add_autoscale_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `pdserve autoscale` subcommand."""
    parser = commands.add_parser(
        "autoscale", help="scale prefill and decode pods on their load (from the Redis registry)",
        description="Decide each role's pod count every --autoscale-interval-s from the registry's load and apply "
        "it with the connector. kubernetes: publish the target counts on /metrics for KEDA or an HPA. local: only "
        "with `pdserve up --autoscale`, which runs the pods it acts on.",
    )  # fmt: skip
    parser.add_argument("--redis-url", required=True, help="the Redis of the pod registry")
    parser.add_argument("--connector", choices=CONNECTORS, default="kubernetes", help="how to apply changes "
                        "(default: kubernetes)")  # fmt: skip
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help=f"the autoscaler's /metrics port; -1: none (default: {DEFAULT_METRICS_PORT})")  # fmt: skip
    parser.add_argument("--metrics-host", default="0.0.0.0", help="interface of /metrics (default: 0.0.0.0)")
    add_config_args(parser, AutoscalerConfig)
    parser.set_defaults(func=autoscale_command)


def add_up_flags(up: argparse.ArgumentParser) -> None:
    """`pdserve up --autoscale` and the autoscaler's settings."""
    up.add_argument("--autoscale", action="store_true", help="run the autoscaler (local connector) beside the "
                    "cluster: it adds and drains pods between the --min/--max bounds")  # fmt: skip
    add_config_args(up, AutoscalerConfig)


def autoscale_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`pdserve autoscale`: run until SIGINT or SIGTERM; the exit code."""
    if args.connector == "local":
        print("pdserve autoscale: --connector local acts on the pods of a local cluster; run `pdserve up "
              "--autoscale` instead", file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = config_from_args(AutoscalerConfig, args)
    except ConfigValueError as exc:
        print(f"pdserve autoscale: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    autoscaler = Autoscaler(config, args.redis_url, KubernetesConnector)
    if args.metrics_port >= 0:
        port = autoscaler.serve_metrics(args.metrics_port, args.metrics_host)
        print(f"pdserve autoscale: metrics on http://{args.metrics_host}:{port}/metrics", flush=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    asyncio.run(autoscaler.run(stop))
    return 0


def autoscaler_config(args: argparse.Namespace) -> AutoscalerConfig | None:
    """`pdserve up`: the autoscaler's settings with --autoscale, else None; raises ConfigValueError."""
    return config_from_args(AutoscalerConfig, args) if args.autoscale else None


def start_for_cluster(config: AutoscalerConfig, cluster: LocalCluster) -> tuple[Autoscaler, str | None]:
    """Start the autoscaler of `pdserve up --autoscale` on its thread; it and its /metrics URL (None: off)."""
    autoscaler = Autoscaler(config, cluster.redis_url, lambda _: LocalConnector(cluster))
    url = None
    base = cluster.config.metrics_port
    if base is not None:
        host = cluster.config.host
        port = autoscaler.serve_metrics(base + UP_METRICS_OFFSET if base else 0, host)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/metrics"
    autoscaler.start_thread()
    return autoscaler, url
