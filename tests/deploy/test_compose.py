"""docker-compose.yml: valid for docker-compose (offline `config`), and the rules a pdserve deployment keeps."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.connection import parse_url

from autoscaler.config import AutoscalerConfig
from cli.main import _parser
from common.config import env_name
from pod.config import PodServerConfig, RegistryConfig
from router.__main__ import parse_args as parse_router_args
from tests.deploy.helpers import DEFAULT_DRAIN_TIMEOUT_S, ROOT, ROUTER_DRAIN_S, duration_s, flag_value, require_tool

COMPOSE_FILE = ROOT / "docker-compose.yml"
POD_ROLES = ("prefill", "decode")
PASSWORD = "test-password-123"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _role(service: dict[str, Any]) -> str | None:
    """The pdserve command a service runs (router, prefill, decode, autoscale), None for other images."""
    command = service.get("command")
    if isinstance(command, list) and command and command[0] in ("router", "prefill", "decode", "autoscale"):
        return str(command[0])
    return None


def _pod_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if _role(s) in POD_ROLES}


def _compose_config(*args: str, password: str | None = PASSWORD) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_PASSWORD"}
    if password is not None:
        env["REDIS_PASSWORD"] = password
    return subprocess.run(
        [require_tool("docker-compose"), "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), *args, "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("profiles", [(), ("gpu",), ("observability",), ("gpu", "observability")])
def test_docker_compose_config_accepts_the_file(profiles: tuple[str, ...]) -> None:
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    result = _compose_config(*args)
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert {"redis", "router", "prefill", "decode", "autoscaler"} <= set(rendered["services"])
    urls = [flag_value(s["command"], "--redis-url") for s in rendered["services"].values() if _role(s)]
    assert urls and all(url == f"redis://:{PASSWORD}@redis:6379/0" for url in urls), urls


def test_docker_compose_config_requires_the_redis_password() -> None:
    result = _compose_config(password=None)
    assert result.returncode != 0
    assert "REDIS_PASSWORD" in result.stderr


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), name
        assert check["test"] and check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_pdserve_services_check_grpc_health_on_their_port(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        role = _role(service)
        if role in ("router", *POD_ROLES):
            port = flag_value(service["command"], "--port")
            assert service["healthcheck"]["test"] == ["CMD", "pdserve", "health", f"127.0.0.1:{port}"], name


def test_every_dependency_waits_for_a_healthy_service(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: depends_on must be the long form with conditions"
        for dependency, spec in depends_on.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert spec == {"condition": "service_healthy"}, f"{name} -> {dependency}: {spec}"
            assert "healthcheck" in services[dependency]


def test_scaled_pods_have_no_fixed_host_ports_or_container_names(services: dict[str, dict[str, Any]]) -> None:
    pods = _pod_services(services)
    assert {"prefill", "decode"} <= set(pods)
    for name, service in pods.items():
        assert "ports" not in service, f"{name} publishes host ports: replicas would clash"
        assert "container_name" not in service, f"{name} has a container_name: it could not scale"


def test_pods_bind_all_interfaces_and_advertise_the_container_hostname(services: dict[str, dict[str, Any]]) -> None:
    for name, service in _pod_services(services).items():
        command = service["command"]
        assert flag_value(command, "--host") == "0.0.0.0", name
        assert flag_value(command, "--advertise-host") is None, f"{name}: every replica would advertise one name"
    # What they then register: the container's hostname, which the compose network's DNS resolves.
    assert PodServerConfig(host="0.0.0.0").public_host == socket.gethostname()


def test_stop_grace_period_covers_the_drain(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        role = _role(service)
        if role in POD_ROLES:
            drain = float(flag_value(service["command"], "--drain-timeout-s") or DEFAULT_DRAIN_TIMEOUT_S)
        elif role == "router":
            drain = ROUTER_DRAIN_S
        else:
            continue
        assert duration_s(service.get("stop_grace_period", "10s")) >= drain + 5, name


def test_only_the_router_publishes_its_grpc_port(services: dict[str, dict[str, Any]]) -> None:
    router = services["router"]
    assert any(str(p).endswith(f":{flag_value(router['command'], '--port')}") for p in router["ports"])
    for name, service in services.items():
        if _role(service) and name != "router":
            assert "ports" not in service, name


def test_services_use_the_password_protected_redis_url(services: dict[str, dict[str, Any]]) -> None:
    assert "--requirepass" in " ".join(services["redis"]["command"])
    for name, service in services.items():
        if _role(service):
            url = flag_value(service["command"], "--redis-url")
            assert url is not None and url.startswith("redis://:${REDIS_PASSWORD"), f"{name}: {url}"
    # The URL form after interpolation: pdserve's registry accepts it, redis-py reads the password from it.
    url = f"redis://:{PASSWORD}@redis:6379/0"
    assert RegistryConfig(redis_url=url).redis_url == url
    assert parse_url(url) == {"password": PASSWORD, "host": "redis", "port": 6379, "db": 0}


def test_profiles(services: dict[str, dict[str, Any]]) -> None:
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    assert profiles == {"gpu", "observability"}
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == {"redis", "router", "prefill", "decode", "autoscaler"}
    observability = {name for name, s in services.items() if "observability" in s.get("profiles", [])}
    assert {"otel-collector", "prometheus", "grafana"} <= observability
    assert {"jaeger", "tempo"} & observability


def test_gpu_profile_gives_each_pod_service_one_gpu(services: dict[str, dict[str, Any]]) -> None:
    gpu = {name: s for name, s in services.items() if "gpu" in s.get("profiles", [])}
    assert {_role(s) for s in gpu.values()} == set(POD_ROLES)
    for name, service in gpu.items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert len(device["device_ids"]) == 1, f"{name}: one GPU per service"
        assert "ports" not in service and "container_name" not in service, name
        # NOTE: nccl between containers that see one GPU each; ipc/pid host for cuda_ipc on a shared device.
        assert flag_value(service["command"], "--kv-transfer-backend") == "${PDSERVE_GPU_KV_BACKEND:-nccl}", name
        assert service.get("ipc") == "host" and service.get("pid") == "host", name
    devices = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for s in gpu.values()]
    assert dict(zip(gpu, devices, strict=True)) == {
        "prefill-gpu0": "${PDSERVE_PREFILL_GPU:-0}",
        "decode-gpu1": "${PDSERVE_DECODE_GPU:-1}",
    }


def test_autoscaler_runs_the_compose_connector_on_this_file(services: dict[str, dict[str, Any]]) -> None:
    autoscaler = services["autoscaler"]
    command = [arg.replace("${COMPOSE_PROJECT_NAME:-pdserve}", "pdserve") for arg in autoscaler["command"]]
    command = [arg.replace("${REDIS_PASSWORD:?set REDIS_PASSWORD}", PASSWORD) for arg in command]
    args = _parser().parse_args(command)
    assert (args.command, args.connector, args.compose_file, args.compose_project) == (
        "autoscale",
        "compose",
        "/etc/pdserve/compose/docker-compose.yml",
        "pdserve",
    )
    assert f"./docker-compose.yml:{args.compose_file}:ro" in autoscaler["volumes"]
    assert "${CONTAINER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock" in autoscaler["volumes"]
    assert autoscaler["environment"]["DOCKER_HOST"] == "unix:///var/run/docker.sock"


def test_the_autoscaler_renders_the_file_as_the_host_does(services: dict[str, dict[str, Any]]) -> None:
    """Every variable the pod services' images and commands use reaches the autoscaler with the same default; its
    bounds default to AutoscalerConfig's."""
    env = services["autoscaler"]["environment"]
    assert env["PDSERVE_IMAGE"] == services["decode"]["image"] == services["prefill"]["image"]
    assert env["PDSERVE_CUDA_IMAGE"] == services["decode-gpu1"]["image"]
    assert env["REDIS_IMAGE"] == services["redis"]["image"]
    assert env["REDIS_PASSWORD"] == "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
    defaults = AutoscalerConfig()
    for name in ("min_prefill", "max_prefill", "min_decode", "max_decode", "autoscale_interval_s"):
        variable = env_name(name)
        assert env[variable] == f"${{{variable}:-{getattr(defaults, name):g}}}", variable


def test_the_autoscaler_outlasts_a_drain_it_started(services: dict[str, dict[str, Any]]) -> None:
    autoscaler_s = duration_s(services["autoscaler"]["stop_grace_period"])
    assert autoscaler_s > max(duration_s(services[role]["stop_grace_period"]) for role in POD_ROLES)


def test_mounted_files_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def test_prometheus_scrapes_every_pdserve_service(services: dict[str, dict[str, Any]]) -> None:
    (mount,) = [v for v in services["prometheus"]["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load(Path(ROOT / mount.split(":")[0]).read_text())
    scraped = {
        name
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
        if sd["port"] == 9100
    }
    for name, service in services.items():
        if _role(service):
            assert flag_value(service["command"], "--metrics-port") == "9100", name
            assert name in scraped, f"prometheus does not scrape {name}"


def test_the_router_runs_the_worker_count_its_variable_says(services: dict[str, dict[str, Any]]) -> None:
    environment = services["router"]["environment"]
    assert environment["PDSERVE_ROUTER_WORKERS"] == "${PDSERVE_ROUTER_WORKERS:-0}"
    tracing = "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert environment[tracing] == services["prefill"]["environment"][tracing], "the shared variables are kept"
    config, _, _, _ = parse_router_args([], {"PDSERVE_ROUTER_WORKERS": "0"})
    assert config.workers == 0, "the default, 0, is the router's own: from the cores"
