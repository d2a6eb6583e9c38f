"""`pdserve up`: Redis, the pods and the router (and, with --autoscale, the autoscaler) as local processes until
Ctrl-C or SIGTERM (`cli.stop_signals`; a SIGKILL takes them along too: `common.child_process`); flags it does not
know go to every pod. While the cluster serves, a note tells `pdserve status` where it is (`cli.running_cluster`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from autoscaler import commands as autoscale
from cli.cluster_config import DEFAULT_METRICS_PORT, ClusterConfig, parse_gpus, visible_gpus
from cli.credentials import ClusterCredentials
from cli.service_process import ClusterError
from cli.stop_signals import stopping_on_signals
from common.config import ConfigValueError
from common.errors import InvalidArgumentError
from engine.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from autoscaler.config import AutoscalerConfig
    from autoscaler.service import Autoscaler
    from cli.cluster import LocalCluster
    from cli.running_cluster import ClusterNote

logger = logging.getLogger(__name__)

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

_UP_FLAGS = {"num_prefill": "prefill", "num_decode": "decode", "router_workers": "router-workers"}
_NO_METRICS = -1
_WATCH_INTERVAL_S = 0.5


def add_up_parser(commands: Commands) -> None:
    up = commands.add_parser(
        "up",
        allow_abbrev=False,
        help="run Redis, the pods and the router locally",
        description="Run a local cluster until Ctrl-C. Flags not listed here go to every "
        "pod (engine flags such as --num-blocks, --max-num-seqs, --heartbeat-s).",
    )
    up.add_argument("--prefill", type=int, default=1, help="number of prefill pods (default: 1)")
    up.add_argument("--decode", type=int, default=1, help="number of decode pods (default: 1)")
    up.add_argument("--host", default="127.0.0.1", help="interface every process binds (default: 127.0.0.1)")
    up.add_argument("--port", type=int, default=50051, help="the router's port (default: 50051)")
    up.add_argument(
        "--http-port", type=int, default=8000, help="the router's OpenAI-compatible HTTP API; 0: off (default: 8000)"
    )
    up.add_argument(
        "--router-workers",
        type=int,
        help="processes serving the router's port (its --workers; default: PDSERVE_ROUTER_WORKERS, else one per 4 "
        "cores, at most 8)",
    )
    up.add_argument("--redis-url", help="use this Redis instead of starting a throwaway redis-server")
    up.add_argument("--model", default=DEFAULT_MODEL, help=f"model of every pod (default: {DEFAULT_MODEL})")
    up.add_argument("--kv-transfer-backend", default="tcp", help="tcp, cuda_ipc or nccl (default: tcp)")
    up.add_argument("--registry-refresh-s", type=float, default=1.0, help="router's pod discovery period")
    up.add_argument("--log-dir", type=Path, help="folder of the processes' logs (default: a new temp folder)")
    up.add_argument("--startup-timeout-s", type=float, default=600.0, help="give up if not serving by then")
    up.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help=f"/metrics of the router; the first prefill and decode pods take the next two ports, "
        f"further pods free ones; 0: free ports for all, {_NO_METRICS}: none (default: "
        f"{DEFAULT_METRICS_PORT})",
    )
    up.add_argument("--otlp-endpoint", help="OTLP collector for every process's traces (default: tracing off)")
    up.add_argument(
        "--gpus",
        help="GPU ids to spread the pods over, comma-separated: one GPU per pod where they "
        "fit (prefill pods, then decode pods, round-robin), as each pod's CUDA_VISIBLE_DEVICES; 'none': "
        "leave it as is (default: every visible GPU: CUDA_VISIBLE_DEVICES, else nvidia-smi; none on a "
        "CPU host)",
    )
    up.add_argument(
        "--secure",
        action="store_true",
        help="bearer tokens + TLS on the router, mTLS router->pods and on KV sockets, Redis password + "
        "TLS: throwaway CA, certificates and token made in --secure-dir (default: off)",
    )
    up.add_argument("--secure-dir", type=Path, help="where --secure writes them (default: <log dir>/secure)")
    autoscale.add_up_flags(up)
    up.set_defaults(func=_up)


def _up(args: argparse.Namespace, pod_args: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _cluster_config(args, pod_args)
        autoscale_config = autoscale.autoscaler_config(args, config.gpus)
    except ConfigValueError as exc:
        print(f"pdserve up: {exc}", file=sys.stderr)
        return 2
    except InvalidArgumentError as exc:
        print(f"pdserve up: --{_UP_FLAGS.get(exc.field, exc.field)}: {exc.description}", file=sys.stderr)
        return 2
    # NOTE: imported here (and cli.status in _status), so `pdserve health`, run by probes, loads no Redis client.
    from cli.cluster import LocalCluster

    if args.secure:
        config = _secured(config, args.secure_dir)
    cluster = LocalCluster(config)
    autoscaler: Autoscaler | None = None
    note: ClusterNote | None = None

    def stop() -> None:
        if autoscaler is not None:
            autoscaler.stop_thread()
        try:
            cluster.stop()
        finally:
            if note is not None:
                note.remove()

    with stopping_on_signals(stop):
        try:
            cluster.start()
            note = _leave_note(cluster)
            autoscaler = _announce(cluster, config, args, autoscale_config)
            while (exited := cluster.poll_exited()) is None:
                time.sleep(_WATCH_INTERVAL_S)
            print(
                f"pdserve: {exited.name} exited with code {exited.returncode}; stopping the cluster. Log tail:\n"
                f"{exited.log_tail()}",
                file=sys.stderr,
            )
            return 1
        except ClusterError as exc:
            print(f"pdserve: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("pdserve: stopping the cluster", file=sys.stderr)
            return 0


def _announce(
    cluster: LocalCluster, config: ClusterConfig, args: argparse.Namespace, autoscale_config: AutoscalerConfig | None
) -> Autoscaler | None:
    """Print where everything of the started cluster is, and start its autoscaler, if asked."""
    from autoscaler.run import start_for_cluster

    print(
        f"pdserve router listening on {cluster.router_address} ({args.prefill} prefill, {args.decode} decode; "
        f"logs in {cluster.log_dir}); Ctrl-C stops everything",
        flush=True,
    )
    for name, url in cluster.metrics_urls.items():
        print(f"  {name} metrics: {url}", flush=True)
    if cluster.http_url is not None:
        print(f"  OpenAI-compatible HTTP API: {cluster.http_url}/v1", flush=True)
    if config.credentials is not None:
        folder = config.credentials.folder
        print(
            f"  secure: TLS (CA {folder / 'ca.pem'}), bearer token in {folder / 'tokens'}, mTLS inside; "
            f'pdserve generate --tls-ca {folder / "ca.pem"} --token "$(cat {folder / "tokens"})" ...',
            flush=True,
        )
    if autoscale_config is not None:
        autoscaler, autoscaler_url = start_for_cluster(autoscale_config, cluster)
        print(f"  autoscaler metrics: {autoscaler_url or 'off'}", flush=True)
        return autoscaler
    return None


def _leave_note(cluster: LocalCluster) -> ClusterNote | None:
    """The note by which `pdserve status` finds the cluster; None (and a warning) where it cannot be written."""
    from cli.running_cluster import ClusterNote, RunningCluster, notes_folder

    try:
        return ClusterNote.write(notes_folder(os.environ), RunningCluster.of(cluster))
    except OSError as exc:
        logger.warning("`pdserve status` will not find this cluster without --redis-url: %s", exc)
        return None


def _cluster_config(args: argparse.Namespace, pod_args: list[str]) -> ClusterConfig:
    """`pdserve up`'s cluster from its flags; raises InvalidArgumentError naming a bad field."""
    return ClusterConfig(
        num_prefill=args.prefill,
        num_decode=args.decode,
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        router_workers=args.router_workers,
        redis_url=args.redis_url,
        model=args.model,
        kv_transfer_backend=args.kv_transfer_backend,
        registry_refresh_s=args.registry_refresh_s,
        pod_args=tuple(pod_args),
        log_dir=args.log_dir,
        startup_timeout_s=args.startup_timeout_s,
        show_progress=True,
        metrics_port=None if args.metrics_port == _NO_METRICS else args.metrics_port,
        otlp_endpoint=args.otlp_endpoint,
        gpus=parse_gpus(args.gpus) if args.gpus is not None else visible_gpus(os.environ),
    )


def _secured(config: ClusterConfig, folder: Path | None) -> ClusterConfig:
    """`config` with throwaway credentials made in `folder` (default: the log folder's `secure`)."""
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="pdserve-cluster-"))
    credentials = ClusterCredentials.create(folder or log_dir / "secure")
    return dataclasses.replace(config, log_dir=log_dir, credentials=credentials)
