"""What the autoscaler's commands run: `pdserve autoscale` until a signal, and the autoscaler of `pdserve up
--autoscale` on its own thread beside the local cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
import threading
from types import FrameType

from autoscaler.compose_connector import ComposeConnector, find_compose_command
from autoscaler.config import AutoscalerConfig, ComposeConfig
from autoscaler.connector import KubernetesConnector
from autoscaler.local_connector import LocalConnector
from autoscaler.service import Autoscaler, ConnectorFactory
from cli.cluster import LocalCluster
from common.config import ConfigValueError, config_from_args
from common.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

UP_METRICS_OFFSET = 3
"""`pdserve up --autoscale`: the autoscaler's /metrics port is the cluster's metrics port + 3 (after the router
and the first prefill and decode pods; cli/cluster_config.py)."""


def autoscale_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`pdserve autoscale`: run until SIGINT or SIGTERM; the exit code."""
    if args.connector == "local":
        print(
            "pdserve autoscale: --connector local acts on the pods of a local cluster; run `pdserve up "
            "--autoscale` instead",
            file=sys.stderr,
        )
        return 2
    try:
        config = config_from_args(AutoscalerConfig, args)
        make_connector = _connector_factory(args)
    except InvalidArgumentError as exc:
        # NOTE: a ConfigValueError names its flag or variable in str(); the others name their flag in the text.
        print(f"pdserve autoscale: {exc if isinstance(exc, ConfigValueError) else exc.description}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    autoscaler = Autoscaler(config, args.redis_url, make_connector)
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


def _connector_factory(args: argparse.Namespace) -> ConnectorFactory:
    """The connector of --connector kubernetes or compose; raises InvalidArgumentError (a bad flag, no compose
    CLI)."""
    if args.connector == "kubernetes":
        return KubernetesConnector
    compose = config_from_args(ComposeConfig, args)
    command = find_compose_command(compose.compose_command)
    print(f"pdserve autoscale: scaling with {shlex.join(command)}", flush=True)
    return lambda _: ComposeConnector(compose, command)


def start_for_cluster(config: AutoscalerConfig, cluster: LocalCluster) -> tuple[Autoscaler, str | None]:
    """Start the autoscaler of `pdserve up --autoscale` on its thread; it and its /metrics URL (None: off)."""
    autoscaler = Autoscaler(config, cluster.redis_url, lambda _: LocalConnector(cluster, cluster.config.stop_timeout_s))
    url = None
    base = cluster.config.metrics_port
    if base is not None:
        host = cluster.config.host
        port = autoscaler.serve_metrics(base + UP_METRICS_OFFSET if base else 0, host)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/metrics"
    autoscaler.start_thread()
    return autoscaler, url
