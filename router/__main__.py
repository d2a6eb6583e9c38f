"""`pdserve router` / `python -m router`: the public gRPC front door.

Serves pdserve.v1.GenerationService (plus health and reflection; NOT_SERVING until the tokenizer
pool is up and a live prefill pod and a live decode pod are registered) from a `RouterApp` (router.router_app wires
the parts) and prints `pdserve router serving on <host:port>` once it takes calls (with no live pod yet they wait).
SIGTERM or SIGINT: DRAINING (health NOT_SERVING, GetLoad DRAINING, HTTP /health 503), new Generate calls refused
UNAVAILABLE with a RetryInfo, in-flight calls get `--drain-timeout-s` to finish (health and GetLoad answer
meanwhile), then the servers stop and the process exits 0.
Telemetry (common.telemetry_config flags): OTLP traces when an endpoint is known (else no exporter at all),
Prometheus /metrics on `--metrics-port`.
Security (router.security, each off unless configured): `--tls-cert/--tls-key` on the public port, `--mtls-*` to
the pods, `--auth-tokens-file` / `PDSERVE_AUTH_TOKENS` on the API.
Processes (`--workers` / `PDSERVE_ROUTER_WORKERS`; 0, the default, picks from the cores:
router.processes.router_process): with one, this process serves; with more, it supervises that many worker processes
serving the same ports (router.processes.supervisor, router.processes.worker), and prints the same line once every one
of them serves.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence

import uvloop

from common.auth import AuthConfig
from common.config import ConfigValueError, add_config_args, config_from_args
from common.telemetry_config import TelemetryConfig
from common.tls import ClusterTLSConfig, PublicTLSConfig
from router.config import RouterConfig, RoutingConfig
from router.processes.router_process import RouterProcess, num_workers
from router.processes.supervisor import supervise
from router.security import RouterSecurity

logger = logging.getLogger("router")

_STOP_GRACE_S = 1.0
"""After the drain, how long the calls still open (past the drain timeout, or ending just now) get to finish."""


def parse_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[RouterConfig, RoutingConfig, TelemetryConfig, RouterSecurity]:
    """The router's configs from its flags, else its `PDSERVE_*` variables of `environ` (default: os.environ);
    a bad value exits with a usage error naming its flag or variable."""
    parser = argparse.ArgumentParser(prog="pdserve router", description="The public gRPC front door of pdserve.")
    add_config_args(parser, RouterConfig)
    add_config_args(parser, RoutingConfig)
    add_config_args(parser, TelemetryConfig)
    for part in (PublicTLSConfig, ClusterTLSConfig, AuthConfig):
        add_config_args(parser, part)
    args = parser.parse_args(argv)
    try:
        return (
            config_from_args(RouterConfig, args, environ=environ),
            config_from_args(RoutingConfig, args, environ=environ),
            config_from_args(TelemetryConfig, args, environ=environ),
            RouterSecurity(
                config_from_args(PublicTLSConfig, args, environ=environ),
                config_from_args(ClusterTLSConfig, args, environ=environ),
                config_from_args(AuthConfig, args, environ=environ),
            ),
        )
    except ConfigValueError as exc:
        parser.error(str(exc))


async def serve(
    config: RouterConfig,
    routing: RoutingConfig,
    telemetry: TelemetryConfig,
    security: RouterSecurity,
    process: RouterProcess | None = None,
) -> None:
    """Run the router (or, with `process`, one of its processes) until SIGTERM or SIGINT."""
    # NOTE: imported here, so that a supervisor (`--workers` > 1) loads none of what only a serving process needs
    # (transformers and the tokenizer, gRPC's servers).
    from router.router_app import RouterApp

    process = process or RouterProcess()
    app = await RouterApp.open(config, routing, telemetry, security, process)
    grace_s: float | None = None
    try:
        await app.start()
        serving = "pdserve router" if not process.grouped else f"pdserve router worker {process.index}"
        print(f"{serving} serving on {config.host}:{app.port}", flush=True)
        await app.stopping.wait()
        logger.info("draining: refusing new calls, %.0f s for in-flight ones", config.drain_timeout_s)
        await app.drain(config.drain_timeout_s)
        logger.info("drained")
        grace_s = _STOP_GRACE_S
    finally:
        await app.close(grace_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pdserve router` (argv without the subcommand)."""
    config, routing, telemetry, security = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = num_workers(config.workers)
    if workers > 1:
        return supervise(config, routing, telemetry, security, workers)
    # NOTE: uvloop: much of gRPC's asyncio work per call and per message is event-loop callbacks, which cost less
    # there (bench.online.grpc_floor on the 2-core machine: a two-hop relay of 33 messages 2.0-2.1 ms of CPU per call on
    # uvloop, 2.4-2.5 ms on asyncio's loop).
    uvloop.run(serve(config, routing, telemetry, security))
    return 0


if __name__ == "__main__":
    sys.exit(main())
