"""`pdserve router` / `python -m router`: the public gRPC front door.

Serves pdserve.v1.GenerationService (plus health and reflection; NOT_SERVING until the tokenizer
pool is up) from a `RouterApp` (router.router_app wires the parts) and prints
`pdserve router serving on <host:port>` once ready. SIGTERM or SIGINT: NOT_SERVING, new calls
refused, in-flight calls get `_DRAIN_GRACE_S` to finish, then exit 0.
Telemetry (common.telemetry_config flags): OTLP traces when an endpoint is known (else no exporter at all),
Prometheus /metrics on `--metrics-port`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence

from common.config import ConfigValueError, add_config_args, config_from_args
from common.telemetry_config import TelemetryConfig
from router.config import RouterConfig, RoutingConfig
from router.router_app import RouterApp

logger = logging.getLogger("router")

_DRAIN_GRACE_S = 30.0


def parse_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[RouterConfig, RoutingConfig, TelemetryConfig]:
    """The router's configs from its flags, else its `PDSERVE_*` variables of `environ` (default: os.environ);
    a bad value exits with a usage error naming its flag or variable."""
    parser = argparse.ArgumentParser(prog="pdserve router", description="The public gRPC front door of pdserve.")
    add_config_args(parser, RouterConfig)
    add_config_args(parser, RoutingConfig)
    add_config_args(parser, TelemetryConfig)
    args = parser.parse_args(argv)
    try:
        return (
            config_from_args(RouterConfig, args, environ=environ),
            config_from_args(RoutingConfig, args, environ=environ),
            config_from_args(TelemetryConfig, args, environ=environ),
        )
    except ConfigValueError as exc:
        parser.error(str(exc))


async def serve(config: RouterConfig, routing: RoutingConfig, telemetry: TelemetryConfig) -> None:
    """Run the router until SIGTERM or SIGINT."""
    app = await RouterApp.open(config, routing, telemetry)
    grace_s: float | None = None
    try:
        await app.start()
        print(f"pdserve router serving on {config.host}:{app.port}", flush=True)
        await app.stopping.wait()
        logger.info("draining: refusing new calls, %.0f s for in-flight ones", _DRAIN_GRACE_S)
        await app.drain()
        grace_s = _DRAIN_GRACE_S
    finally:
        await app.close(grace_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pdserve router` (argv without the subcommand)."""
    config, routing, telemetry = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config, routing, telemetry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
