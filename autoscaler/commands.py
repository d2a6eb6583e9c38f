"""The autoscaler's flags: `pdserve autoscale` (a process of its own on a deployment's Redis) and `pdserve up
--autoscale` (beside the local cluster, in its process). cli/main.py adds the parsers; what they run is
`autoscaler.run`, imported only when it runs (so `pdserve health`, run by probes, loads no Redis client).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from autoscaler.config import AutoscalerConfig, ComposeConfig
from common.config import add_config_args, config_from_args

CONNECTORS = ("local", "compose", "kubernetes")
DEFAULT_METRICS_PORT = 9100


def add_autoscale_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `pdserve autoscale` subcommand."""
    parser = commands.add_parser(
        "autoscale",
        help="scale prefill and decode pods on their load (from the Redis registry)",
        description="Decide each role's pod count every --autoscale-interval-s from the registry's load and apply "
        "it with the connector. kubernetes: publish the target counts on /metrics for KEDA or an HPA. compose: scale "
        "the project's prefill and decode services with the compose CLI (--compose-*). local: only with `pdserve up "
        "--autoscale`, which runs the pods it acts on.",
    )
    parser.add_argument("--redis-url", required=True, help="the Redis of the pod registry")
    parser.add_argument(
        "--connector", choices=CONNECTORS, default="kubernetes", help="how to apply changes (default: kubernetes)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"the autoscaler's /metrics port; -1: none (default: {DEFAULT_METRICS_PORT})",
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="interface of /metrics (default: 0.0.0.0)")
    add_config_args(parser, AutoscalerConfig)
    add_config_args(parser, ComposeConfig)
    parser.set_defaults(func=_autoscale)


def add_up_flags(up: argparse.ArgumentParser) -> None:
    """`pdserve up --autoscale` and the autoscaler's settings."""
    up.add_argument(
        "--autoscale",
        action="store_true",
        help="run the autoscaler (local connector) beside the cluster: it adds and drains pods between the --min/--max "
        "bounds; with --gpus, one pod per GPU (--max-total-pods defaults to their number) and GPUs move between roles",
    )
    add_config_args(up, AutoscalerConfig)


def autoscaler_config(args: argparse.Namespace, gpus: Sequence[str] = ()) -> AutoscalerConfig | None:
    """`pdserve up`: the autoscaler's settings with --autoscale, else None; raises ConfigValueError. On `gpus`
    (enough for each role's min) --max-total-pods defaults to one pod per GPU."""
    if not args.autoscale:
        return None
    config = config_from_args(AutoscalerConfig, args)
    if config.max_total_pods or len(gpus) < config.min_prefill + config.min_decode:
        return config
    return dataclasses.replace(config, max_total_pods=len(gpus))


def _autoscale(args: argparse.Namespace, extra: list[str]) -> int:
    from autoscaler.run import autoscale_command

    return autoscale_command(args, extra)
