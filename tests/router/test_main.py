"""`pdserve router` flags, and the router process staying free of torch."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

import router.__main__ as router_main
from common.telemetry_config import TelemetryConfig
from router.__main__ import parse_args
from router.config import RouterConfig, RoutingConfig
from router.security import RouterSecurity


def test_flags_become_configs_and_bad_values_exit_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(
        "--port 0 --redis-url redis://r:1/0 --tokenizer-pool-size 3 --registry-refresh-s 0.5 --max-attempts 5 "
        "--missing-pod-grace-s 0.6 --otlp-endpoint http://c:4317 --metrics-port 9100"
    )
    config, routing, telemetry, security = parse_args(argv, environ={})
    assert config == RouterConfig(port=0, redis_url="redis://r:1/0", tokenizer_pool_size=3, registry_refresh_s=0.5)
    assert routing == RoutingConfig(max_attempts=5, missing_pod_grace_s=0.6)
    assert telemetry == TelemetryConfig(otlp_endpoint="http://c:4317", metrics_port=9100)
    assert security == RouterSecurity()
    assert parse_args([], environ={}) == (RouterConfig(), RoutingConfig(), TelemetryConfig(), RouterSecurity())
    with pytest.raises(SystemExit) as info:
        parse_args(["--block-size", "24"])
    assert info.value.code == 2
    assert "--block-size: must be a power of two, got 24" in capsys.readouterr().err


def test_the_router_imports_no_torch(smollm2_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; import router.__main__\n"
        "from router.tokenizer.tokenizer_pool import load_tokenizer\n"
        "tokenizer = load_tokenizer(Path(sys.argv[1]))\n"
        "tokenizer.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(smollm2_path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_router_serves_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops = []

    async def serve(*configs: object) -> None:
        loops.append(type(asyncio.get_running_loop()))

    monkeypatch.setattr(router_main, "serve", serve)
    assert router_main.main(["--port", "0"]) == 0
    assert loops == [uvloop.Loop]


def test_more_than_one_worker_runs_the_supervisor_one_serves_here(monkeypatch: pytest.MonkeyPatch) -> None:
    supervised: list[tuple[RouterConfig, int]] = []
    served: list[RouterConfig] = []

    def supervise(config: RouterConfig, routing: object, telemetry: object, security: object, workers: int) -> int:
        supervised.append((config, workers))
        return 3

    async def serve(config: RouterConfig, *configs: object) -> None:
        served.append(config)

    monkeypatch.setattr(router_main, "supervise", supervise)
    monkeypatch.setattr(router_main, "serve", serve)
    assert router_main.main(["--workers", "2", "--port", "0"]) == 3
    assert supervised == [(RouterConfig(port=0, workers=2), 2)]
    assert router_main.main(["--workers", "1", "--port", "0"]) == 0
    assert served == [RouterConfig(port=0, workers=1)]
