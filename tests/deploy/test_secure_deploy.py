"""The security switches in the deployments: deploy/compose.secure.yml over docker-compose.yml, and the Kubernetes
overlay `secure`. Every variable they set is the variable of a real config field (a misspelt one would be ignored
and leave its switch off), every file it names is in the mounted folder, and the health checks carry the
credentials the servers now require."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import Any

import pytest
import yaml

from common.auth import AuthConfig
from common.config import env_name
from common.tls import ClusterTLSConfig, PublicTLSConfig
from tests.deploy.helpers import ROOT, require_tool
from tests.deploy.test_kubernetes import _containers, _of_kind, _render

TLS_DIR = "/etc/pdserve/tls"
MTLS = {env_name(f.name) for f in dataclasses.fields(ClusterTLSConfig)}
ROUTER_ONLY = {env_name(f.name) for cls in (PublicTLSConfig, AuthConfig) for f in dataclasses.fields(cls)} - {
    env_name("auth_tokens"),
    env_name("auth_exempt_health"),
}
ROUTER_WORKERS = "PDSERVE_ROUTER_WORKERS"
FILES = {"ca.pem", "internal.pem", "internal.key", "public.pem", "public.key", "tokens"}
POD_HEALTH = [
    "pdserve",
    "health",
    "127.0.0.1:50051",
    "--tls-ca",
    f"{TLS_DIR}/ca.pem",
    "--tls-cert",
    f"{TLS_DIR}/internal.pem",
    "--tls-key",
    f"{TLS_DIR}/internal.key",
]
ROUTER_HEALTH = ["pdserve", "health", "127.0.0.1:50051", "--tls-ca", f"{TLS_DIR}/ca.pem"]


def _rendered_compose() -> dict[str, Any]:
    env = {**os.environ, "REDIS_PASSWORD": "test-password-123", "PDSERVE_TLS_DIR": "/srv/pdserve-tls"}
    result = subprocess.run(
        [
            require_tool("docker-compose"),
            "--project-directory",
            str(ROOT),
            "-f",
            str(ROOT / "docker-compose.yml"),
            "-f",
            str(ROOT / "deploy" / "compose.secure.yml"),
            "--profile",
            "gpu",
            "config",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rendered: dict[str, Any] = yaml.safe_load(result.stdout)
    return rendered


def _named_files(env: dict[str, str]) -> set[str]:
    return {value.rsplit("/", 1)[1] for value in env.values() if value.startswith("/etc/pdserve/")}


def test_compose_secure_turns_every_switch_on() -> None:
    services = _rendered_compose()["services"]
    for name in ("router", "prefill", "decode", "prefill-gpu0", "decode-gpu1"):
        service = services[name]
        # NOTE: the router's process count (docker-compose.yml) is no security switch.
        env = {k: v for k, v in service["environment"].items() if k.startswith("PDSERVE_") and k != ROUTER_WORKERS}
        expected = MTLS | ROUTER_ONLY if name == "router" else MTLS
        assert set(env) == expected, name
        assert _named_files(env) <= FILES, name
        assert all(value.startswith(f"{TLS_DIR}/") for value in env.values()), name
        assert service["volumes"] == [f"/srv/pdserve-tls:{TLS_DIR}:ro"], name
        assert service["healthcheck"]["test"] == ["CMD", *(ROUTER_HEALTH if name == "router" else POD_HEALTH)], name


@pytest.fixture(scope="module")
def secure_overlay() -> list[dict[str, Any]]:
    return _render("secure")


def test_kubernetes_secure_overlay_turns_every_switch_on(secure_overlay: list[dict[str, Any]]) -> None:
    deployments = _of_kind(secure_overlay, "Deployment")
    for name, container in _containers(secure_overlay):
        if name not in ("router", "prefill", "decode"):
            continue
        env = {e["name"]: e["value"] for e in container["env"] if e["name"] in MTLS | ROUTER_ONLY}
        assert set(env) == (MTLS | ROUTER_ONLY if name == "router" else MTLS), name
        assert _named_files(env) <= FILES, name
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {
            v["name"]: v["secret"]["secretName"]
            for v in deployments[name]["spec"]["template"]["spec"]["volumes"]
            if "secret" in v
        }
        assert volumes[mounts[TLS_DIR]] == "pdserve-tls", name
        if name == "router":
            assert volumes[mounts["/etc/pdserve/auth"]] == "pdserve-auth"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in container[probe], f"{name} {probe}: the kubelet's gRPC probe speaks plain text"
            assert container[probe]["exec"]["command"] == (ROUTER_HEALTH if name == "router" else POD_HEALTH)
        assert deployments[name]["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001


def test_kubernetes_secure_overlay_matches_the_schemas(secure_overlay: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = 0
    for resource in secure_overlay:
        if not resource["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(resource, "1.30.0", strict=True)
            checked += 1
    assert checked >= 10
